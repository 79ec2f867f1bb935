// TokenFuse's example workflows in ComfyUI's template browser: their order, titles and descriptions.
//
// ComfyUI (0.3.64) lists a pack's workflows/ as bare file names, in file-system order. Frontend 1.27.x builds each
// custom template as {name, mediaType, mediaSubtype, description: name} with `templates.map(...)` over the list it
// fetched (useWorkflowTemplatesStore), and shows `template.title ?? template.name` as the title and the description
// with "-" and "_" turned into spaces: raw, cut-off file names. Core templates get their texts from an index.json and
// the frontend's own translations, which custom packs cannot extend (the translation keys hold the pack's folder
// name). So the list handed to the store carries its own `map`: it calls the frontend's callback and adds the title
// and description below to each template object the callback builds for one of these names. Everything else the
// frontend does with the list (iterate, filter, index, JSON) sees a plain array of names.

/** In the order the browser shows them: by GPU budget (4 -> 6 -> 8 GB), the video workflow last. */
export const TEMPLATES = [
  {
    name: "tokenfuse_face_refine_sd15_4gb",
    title: "4 GB · Face refine (SD1.5)",
    description: "Sharpens the main face of a photo on a 4 GB GPU: SD1.5 redraws only a 512 px face crop, with the strongest token saving, then GFPGAN.",
  },
  {
    name: "tokenfuse_face_swap_sd15_6gb",
    title: "6 GB · Face swap (SD1.5)",
    description: "Puts the face of a source photo on the main face of a target photo (inswapper), then SD1.5 redraws it at 512 px on a 6 GB GPU.",
  },
  {
    name: "tokenfuse_group_photo_multiface_sd15",
    title: "6 GB · Group photo (SD1.5)",
    description: "Refines every face of a group photo, left to right, three at a time with SD1.5 on a 6 GB GPU. Small faces gain most.",
  },
  {
    name: "tokenfuse_face_refine_sdxl_8gb",
    title: "8 GB · Face refine (SDXL)",
    description: "Refines the main face of a photo with SDXL in a 1024 px face crop on an 8 GB GPU.",
  },
  {
    name: "tokenfuse_video_face_refine_sd15_6gb",
    title: "6 GB · Video face refine (SD1.5)",
    description: "Refines the main face through a whole video on a 6 GB GPU: the face is tracked, only key frames are redrawn, the others follow by optical flow. Audio is kept.",
  },
];

const BY_NAME = new Map(TEMPLATES.map((t, i) => [t.name, { ...t, rank: i }]));

/**
 * TokenFuse's template names in the browser's order: the TEMPLATES order, names it does not know after them by name.
 * @param {string[]} names template names (file names without .json)
 */
export function orderTemplates(names) {
  const rank = (n) => BY_NAME.get(n)?.rank ?? Infinity;
  return [...names].sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
}

/**
 * A copy of `names` whose `map` adds {title, description} to each template object the frontend's callback builds for
 * a known name (an object whose `name` is that name); other results pass unchanged.
 * @param {string[]} names
 */
export function withTemplateTexts(names) {
  const list = [...names];
  Object.defineProperty(list, "map", {
    enumerable: false,
    value(fn, thisArg) {
      return Array.prototype.map.call(this, (name, i, arr) => {
        const made = fn.call(thisArg, name, i, arr);
        const text = BY_NAME.get(name);
        if (!text || !made || typeof made !== "object" || made.name !== name) return made;
        return { ...made, title: text.title, description: text.description };
      });
    },
  });
  return list;
}
