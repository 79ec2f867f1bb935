// Words and text layout of the scheduler chart and the report panels (pure: no canvas, no DOM).
//
// One unit everywhere: the share of a level's tokens REMOVED from self-attention, in percent ("−40 %"), on the bars,
// in the header and in the live rows.

import { LEVELS, STRATEGY_LABELS } from "./vocabulary.js";

/** Plain names for the strategies (scheduling/vocabulary.py STRATEGY_LABELS); "todo" is ToDo (token downsampling). */
export { STRATEGY_LABELS };

/** Display name of a model family for the chart header. */
export const FAMILY_LABELS = Object.freeze({ sd15: "SD1.5", sdxl: "SDXL", dit: "DiT" });

/**
 * The strategy as the chart names it. `widget` is the strategy widget's value ("preset" = the preset's own
 * strategy), `resolved` the strategy in force.
 */
export function strategyText(widget, resolved) {
  const name = STRATEGY_LABELS[resolved] ?? String(resolved ?? "?");
  return widget === "preset" || widget === undefined ? `${name} (the preset's)` : name;
}

/** Percent removed as the bars print it: 0.89 -> "89", 0 -> "0". */
export function percentText(ratio) {
  const r = Number.isFinite(ratio) ? ratio : 0;
  return String(Math.round(Math.max(0, Math.min(1, r)) * 100));
}

/**
 * The chart's header line.
 * @param {{preset: string, strategy: string, ratios?: object}} schedule resolveSchedule()'s result
 * @param {object} values widget values of the node
 * @param {string} family "sd15" | "sdxl"
 * @param {string} familySource where the family came from: "run", "checkpoint" or "default"
 */
export function chartHeader(schedule, values, family, familySource) {
  const fam = FAMILY_LABELS[family] ?? family;
  const src = familySource === "run" ? "from the last run" : familySource === "checkpoint" ? "from the checkpoint name" : "assumed";
  const dit = family === "dit";
  // DiT: one sequence, no U-Net blocks or levels; the strategy widget does not apply (top-K keys always)
  const what = dit ? "% of K/V tokens dropped per attention call" : "% of tokens removed per block";
  const anyOn = dit ? schedule.ditRatio > 0 : Object.values(schedule.ratios ?? {}).some((r) => r > 0);
  if (!anyOn) return `${what} · ${fam} (${src}) · preset ${schedule.preset}: nothing removed`;
  const ratio = Number(values?.ratio);
  const detail = ratio > 0 ? ` · ratio ${ratio.toFixed(2)}` : "";
  const strategy = dit ? STRATEGY_LABELS.topk : strategyText(values?.strategy, schedule.strategy);
  return `${what} · ${fam} (${src}) · ${schedule.preset} · ${strategy}${detail}`;
}

/** What the DiT chart's one bar means (the chart is per U-Net level; DiT models have none). */
export const DIT_LEGEND = "DiT: one bar for every attention call (no U-Net levels; the bars are per level for U-Nets)";

/**
 * The legend: what the /8 … /64 colours mean. Short enough for one line after the coloured swatches at the node's
 * default width (400 px, 10 px font: about 46 characters; the longer text was cut off there).
 */
export function legendText(levels) {
  const finest = Math.min(...(levels?.length ? levels : LEVELS));
  return `colour = U-Net level, latent = image / N (/${finest} finest)`;
}

/**
 * Split text into lines no wider than maxWidth, by words (a word longer than a line is cut by characters).
 * @param {string} text may contain "\n"
 * @param {number} maxWidth in the units of measure()
 * @param {(s: string) => number} measure width of a string (ctx.measureText(s).width in the browser)
 * @returns {string[]}
 */
export function wrapText(text, maxWidth, measure) {
  const out = [];
  const width = (s) => Number(measure(s)) || 0;
  for (const para of String(text ?? "").split("\n")) {
    let line = "";
    for (const word of para.split(/ +/)) {
      const candidate = line ? `${line} ${word}` : word;
      if (width(candidate) <= maxWidth || !line) {
        line = candidate;
      } else {
        out.push(line);
        line = word;
      }
      while (width(line) > maxWidth && line.length > 1) {
        let cut = line.length - 1;
        while (cut > 1 && width(line.slice(0, cut)) > maxWidth) cut--;
        out.push(line.slice(0, cut));
        line = line.slice(cut);
      }
    }
    out.push(line);
  }
  return out;
}

/**
 * Lines a node shows from its executed message's ui.text (a list of strings; ScheduledFusion sends its multi-line
 * report as one string). Each line carries whether it is a warning.
 * @returns {{text: string, warn: boolean}[]}
 */
export function reportLines(uiText) {
  const items = Array.isArray(uiText) ? uiText : typeof uiText === "string" ? [uiText] : [];
  const lines = [];
  for (const item of items) {
    if (typeof item !== "string") continue;
    for (const ln of item.split("\n")) {
      if (!ln.trim()) continue;
      lines.push({ text: ln, warn: isWarning(ln) });
    }
  }
  return lines;
}

/**
 * Whether a report line needs the user's attention: a warning, a pass-through, an error, a fallback taken
 * ("fallbacks: none" is fine), or a summary counting faces with fallbacks / passed through.
 */
export function isWarning(line) {
  const ln = String(line ?? "");
  return (
    /WARNING|warnings:|: passthrough|error:/i.test(ln) ||
    /fallbacks: (?!none)/.test(ln) ||
    /(^|\D)[1-9]\d* (with fallbacks|passed through)/.test(ln)
  );
}

/**
 * The model family a checkpoint / UNet file name suggests, before any run: "sdxl" for SDXL-family names
 * (sd_xl_base_1.0, juggernautXL_v9, ponyDiffusionV6XL, RealVisXL), "dit" for the DiT families the scheduler reaches
 * (flux1-dev, wan2.1_t2v, qwen_image, hunyuan_video, ltx-video), else null (the chart keeps its default).
 */
export function familyFromModelName(name) {
  if (typeof name !== "string" || !name) return null;
  const base = name.split(/[\\/]/).pop().toLowerCase();
  if (/sd_?xl|xl(?![a-z])/.test(base)) return "sdxl";
  // DiT families the scheduler reaches through the attention override (DESIGN.md §5)
  return /flux|(^|[^a-z])wan_?2|qwen[_-]?image|hunyuan[_-]?video|(^|[^a-z])ltx/.test(base) ? "dit" : null;
}

/**
 * Names among `names` of the widgets whose value comes from a link (a widget converted to an input and connected):
 * the run uses the linked value, which the editor does not know before the run.
 * @param {{name?: string, widget?: {name?: string}, link?: (number|null)}[]|undefined} inputs the node's inputs
 * @param {string[]} names
 */
export function linkedWidgets(inputs, names) {
  const out = [];
  for (const input of Array.isArray(inputs) ? inputs : []) {
    const name = input?.widget?.name ?? input?.name;
    if (names.includes(name) && input.link !== null && input.link !== undefined && !out.includes(name)) out.push(name);
  }
  return out;
}

/**
 * The chart's note under the bars: what the server would refuse in schedule_text (error), inputs fed by a link
 * (warn: the chart cannot draw what the run will use), else the active window of the schedule.
 * @returns {{text: string, level: ("error"|"warn"|"info")}}
 */
export function chartNote(schedule, linked = []) {
  if (schedule?.textError) return { text: schedule.textError, level: "error" };
  if (linked.length) {
    const shown = linked.includes("schedule_text") ? " (schedule_text is left out)" : "";
    return {
      text: `from a link, not drawn: ${linked.join(", ")}: the run uses the linked value; the chart shows the widgets${shown}`,
      level: "warn",
    };
  }
  const pct = (x) => `${Math.round(x * 100)}%`;
  return { text: `active in ${pct(schedule.startPercent)}–${pct(schedule.endPercent)} of the steps (bar above)`, level: "info" };
}
