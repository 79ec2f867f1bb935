import { test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync } from "node:fs";
import { TEMPLATES, orderTemplates, withTemplateTexts } from "../lib/templates.js";
import { WORKFLOWS } from "../../tools/workflow_specs.mjs";

const workflowsDir = new URL("../../workflows/", import.meta.url);
const shipped = readdirSync(workflowsDir).filter((f) => f.endsWith(".json")).map((f) => f.replace(/\.json$/, ""));

test("templates are ordered 4 -> 6 -> 8 GB, the video workflow last", () => {
  const listed = [...shipped].sort().reverse(); // the server lists them in file-system order
  assert.deepEqual(orderTemplates(listed), [
    "tokenfuse_face_refine_sd15_4gb", "tokenfuse_face_swap_sd15_6gb", "tokenfuse_group_photo_multiface_sd15",
    "tokenfuse_face_refine_sdxl_8gb", "tokenfuse_video_face_refine_sd15_6gb",
  ]);
  assert.deepEqual(orderTemplates(["tokenfuse_zz", ...listed]).at(-1), "tokenfuse_zz"); // unknown names last
  assert.deepEqual(orderTemplates([]), []);
});

test("every shipped workflow has a title and a description; titles start with its template card's title", () => {
  assert.deepEqual(TEMPLATES.map((t) => t.name).sort(), [...shipped].sort());
  for (const t of TEMPLATES) {
    const card = WORKFLOWS.find((w) => w.name === t.name)?.card;
    assert.ok(card, t.name);
    assert.ok(t.title.toLowerCase().startsWith(card.title.toLowerCase()), `${t.title} vs ${card.title}`);
    assert.ok(t.title.length <= 34, t.title); // the card shows about that much on one line
    // frontend 1.27 turns "-" and "_" of a custom template's description into spaces
    assert.ok(!/[-_]/.test(t.description) && t.description.length >= 60, t.description);
  }
});

test("the frontend's template objects get the titles; the list stays a plain list of names", () => {
  const list = withTemplateTexts(orderTemplates(shipped));
  // what useWorkflowTemplatesStore (frontend 1.27.10) does with a custom pack's list
  const made = list.map((name) => ({ name, mediaType: "image", mediaSubtype: "jpg", description: name }));
  assert.equal(made[0].title, "4 GB · Face refine (SD1.5)");
  assert.equal(made[0].name, "tokenfuse_face_refine_sd15_4gb");
  assert.match(made[0].description, /^Sharpens the main face/);
  assert.equal(made.at(-1).title, TEMPLATES.at(-1).title);
  assert.deepEqual(JSON.parse(JSON.stringify(list)), orderTemplates(shipped));
  assert.deepEqual([...list], orderTemplates(shipped));
  assert.deepEqual(Object.keys(list), ["0", "1", "2", "3", "4"]);
  assert.deepEqual(list.map((n) => n.length), orderTemplates(shipped).map((n) => n.length)); // other callbacks as usual
  assert.equal(withTemplateTexts(["x"]).map((n) => ({ name: n }))[0].title, undefined);
});
