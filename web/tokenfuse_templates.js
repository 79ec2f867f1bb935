// Template browser: TokenFuse's example workflows ordered by GPU budget (4 -> 6 -> 8 GB, video last), with titles and
// descriptions a user reads instead of file names (web/lib/templates.js says how the frontend gets them).
//
// Only lists made of TokenFuse's templates (names starting "tokenfuse_") are touched; anything unexpected leaves the
// answer as it came.

import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import { orderTemplates, withTemplateTexts } from "./lib/templates.js";

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
            answer[pack] = withTemplateTexts(orderTemplates(names));
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
