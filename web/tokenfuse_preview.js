// PatchTokenize in the browser: make room for the plan preview the node returns as {"ui": {"images": [...]}}.
//
// Current ComfyUI frontends draw ui.images on any node by themselves; this only enlarges the node so the preview
// is visible, and on frontends that did not set node.imgs it loads the images itself.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { viewRoutes } from "./lib/preview.js";

const NODE_TYPE = "TokenFusePatchTokenize";
const PREVIEW_H = 240;
const MIN_W = 260;
const FRONTEND_PREVIEW = "$$canvas-image-preview"; // frontend 1.2x: the image preview is a widget of the node

// Room for the preview below the widgets. Once the frontend has added its preview widget, computeSize() already
// counts the preview: adding PREVIEW_H again made the node grow on the second run into the nodes below it.
function ensureRoom(node) {
  const min = node.computeSize?.();
  const w = node.size?.[0] ?? 0;
  const h = node.size?.[1] ?? 0;
  const counted = node.widgets?.some((x) => x?.name === FRONTEND_PREVIEW || x?.type === "IMAGE_PREVIEW");
  const wantH = (min?.[1] ?? 0) + (counted ? 0 : PREVIEW_H);
  if (h < wantH || w < MIN_W) node.setSize?.([Math.max(w, MIN_W), Math.max(h, wantH)]);
}

function loadFallback(node, routes) {
  if (Array.isArray(node.imgs) && node.imgs.length) return;
  const imgs = routes.map((route) => {
    const img = new Image();
    img.onload = () => node.setDirtyCanvas?.(true, true);
    img.src = api.apiURL(route);
    return img;
  });
  node.imgs = imgs;
  node.imageIndex = null;
}

app.registerExtension({
  name: "tokenfuse.planPreview",

  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE_TYPE) return;
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message, ...rest) {
      const r = onExecuted?.apply(this, [message, ...rest]);
      try {
        const routes = viewRoutes(message?.images, Date.now());
        if (routes.length) {
          ensureRoom(this);
          // Give the frontend's own preview handling a moment before falling back.
          setTimeout(() => {
            try {
              loadFallback(this, routes);
            } catch (err) {
              console.warn("[tokenfuse] plan preview fallback failed:", err);
            }
          }, 500);
          this.setDirtyCanvas?.(true, true);
        }
      } catch (err) {
        console.warn("[tokenfuse] plan preview skipped:", err);
      }
      return r;
    };
  },
});
