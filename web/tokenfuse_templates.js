// Template browser: TokenFuse's example workflows ordered by GPU budget, 4 GB first.
//
// ComfyUI (0.3.64) lists a pack's workflows/ in file-system order and its frontend (1.27.x) shows them in the order
// it receives them, so the list is sorted here where the frontend fetches it. Only lists made of TokenFuse's
// templates (names starting "tokenfuse_") are touched; anything unexpected leaves the answer as it came.

import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import { orderTemplates } from "./lib/labels.js";

app.registerExtension({
  name: "tokenfuse.templates",

  setup() {
    const original = api?.getWorkflowTemplates;
    if (typeof original !== "function" || original.__tokenfuse) return;
    const ordered = async function (...args) {
      const answer = await original.apply(this, args);
      try {
        for (const [pack, names] of Object.entries(answer ?? {})) {
          if (Array.isArray(names) && names.length && names.every((n) => typeof n === "string" && n.startsWith("tokenfuse_"))) {
            answer[pack] = orderTemplates(names);
          }
        }
      } catch (err) {
        console.warn("[tokenfuse] template order skipped:", err);
      }
      return answer;
    };
    ordered.__tokenfuse = true;
    api.getWorkflowTemplates = ordered;
  },
});
