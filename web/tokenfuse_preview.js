// PatchTokenize in the browser: the room for the plan preview the node returns as {"ui": {"images": [...]}} is
// reserved when the node is created, so the node never grows over its neighbours when the preview arrives.
//
// Frontend 1.27 draws ui.images by itself: it adds an image-preview widget (at least PREVIEW_MIN_H tall) when the
// first images come and grows the node to fit it. A node made with that room already (this file, or a saved
// workflow's size) keeps its size; on frontends that did not set node.imgs the images are loaded here.

import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";
import { viewRoutes } from "./lib/preview.js";
import { previewRoom } from "./lib/layout.js";

const NODE_TYPE = "TokenFusePatchTokenize";
const PREVIEW_MIN_H = 220; // the frontend's image-preview widget: computeLayoutSize().minHeight (1.27.x)
const MIN_W = 260;
const FRONTEND_PREVIEW = "$$canvas-image-preview"; // frontend 1.2x: the image preview is a widget of the node

// Room for the preview below the widgets, once every extension has added its widgets (the report panel comes from
// tokenfuse_report.js's onNodeCreated). Once the frontend has added its preview widget, computeSize() counts it.
function reserveRoom(node) {
  const counted = node.widgets?.some((x) => x?.name === FRONTEND_PREVIEW || x?.type === "IMAGE_PREVIEW");
  const want = previewRoom(node.size, node.computeSize?.(), counted ? 0 : PREVIEW_MIN_H, MIN_W);
  if (want) node.setSize?.(want);
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
    const proto = nodeType.prototype;
    const onNodeCreated = proto.onNodeCreated;
    proto.onNodeCreated = function (...args) {
      const r = onNodeCreated?.apply(this, args);
      // After the other onNodeCreated hooks (their widgets count) and only for a new node: a node loaded from a
      // workflow is configured right after creation, in the same task, and keeps the size saved with it.
      queueMicrotask(() => {
        try {
          if (!this.__tokenfuseConfigured) reserveRoom(this);
        } catch (err) {
          console.warn("[tokenfuse] plan preview room skipped:", err);
        }
      });
      return r;
    };
    const onConfigure = proto.onConfigure;
    proto.onConfigure = function (...args) {
      this.__tokenfuseConfigured = true;
      return onConfigure?.apply(this, args);
    };
    const onExecuted = proto.onExecuted;
    proto.onExecuted = function (message, ...rest) {
      const r = onExecuted?.apply(this, [message, ...rest]);
      try {
        const routes = viewRoutes(message?.images, Date.now());
        if (routes.length) {
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
