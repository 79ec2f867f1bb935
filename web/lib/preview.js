// PatchTokenize plan preview: turn an executed message's images into /view URLs (pure).

/**
 * `/view?...` routes for the images a node returned in {"ui": {"images": [...]}}.
 * Entries without a filename are skipped; `rand` busts the browser cache between runs.
 *
 * @param {{filename: string, subfolder?: string, type?: string}[]|undefined} images
 * @param {string|number} [rand]
 * @returns {string[]} routes to pass through api.apiURL()
 */
export function viewRoutes(images, rand = "") {
  if (!Array.isArray(images)) return [];
  return images
    .filter((im) => im && typeof im.filename === "string" && im.filename)
    .map((im) => {
      const q = new URLSearchParams({
        filename: im.filename,
        subfolder: typeof im.subfolder === "string" ? im.subfolder : "",
        type: typeof im.type === "string" && im.type ? im.type : "temp",
      });
      if (rand !== "") q.set("rand", String(rand));
      return `/view?${q.toString()}`;
    });
}
