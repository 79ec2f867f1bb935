// schedule_text as the server reads it: parse like Python's json module and validate like Schedule.__post_init__
// (scheduling/schedule.py), with the same messages, so the chart refuses exactly what a run would refuse (pure).
//
// FIELD_CHECKS is a copy of the checks in Schedule.__post_init__, in their order (the first failing check names the
// error, as in Python). tests/test_web_js.py probes every entry at and beyond its bounds against Python, so a range
// changed on one side only fails a test; web/test/schedule_cases.json is a table of texts with the server's verdict
// that both sides are tested against. Mappings keep the text's key order (JS objects would list integer-like keys
// such as "16" and "8" first), so the first bad `ratios` entry is the one Python names. One known difference:
// Python's int() also takes non-ASCII digits ("８"), which the chart refuses.

import { LEVELS, MAX_RATIO, POOL_MODES, PRESETS, STRATEGIES } from "./vocabulary.js";

export { MAX_RATIO, POOL_MODES, PRESETS, STRATEGIES };
export const SCHEDULE_TEXT_MAX_CHARS = 16_384;
export const SCHEDULE_TEXT_MAX_DEPTH = 8;
/**
 * TokenSchedulerController's widgets a schedule_text may also set by name (scheduling/widgets.py WIDGET_KEYS):
 * preset and ratio always, strategy only with its widget-only value "preset" (any other value is the Schedule field).
 */
export const WIDGET_KEYS = Object.freeze(["preset", "strategy", "ratio"]);
const SEED_MAX = 2n ** 63n - 1n;
const TELEMETRY_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}\.jsonl$/;

/**
 * Range checks of Schedule.__post_init__ after the ratios, in order: [field, kind, lo, hi] with kind "int" (an
 * integer, never a bool) or "float" (an int or a finite float); "order" entries are the `end >= start` checks and
 * "bool" / "telemetry" the other typed fields.
 */
export const FIELD_CHECKS = Object.freeze([
  ["protect_blocks", "int", 0, 64],
  ["ramp_start", "int", 0, 64],
  ["ramp_step", "float", 0, 0.5],
  ["ramp_every", "int", 1, 64],
  ["ramp_cap", "float", 0, MAX_RATIO],
  ["start_percent", "float", 0, 1],
  ["end_percent", "float", 0, 1],
  ["end_percent", "order", "start_percent"],
  ["adaptive", "float", 0, 1],
  ["sx", "int", 1, 8],
  ["sy", "int", 1, 8],
  ["dit_ratio", "float", 0, MAX_RATIO],
  ["seed", "int", 0, SEED_MAX],
  ["telemetry_jsonl", "telemetry"],
  ["time_calls", "bool"],
  ["device_aware", "bool"],
  ["cache_interval", "int", 0, 10],
  ["cache_depth", "int", 1, 11],
  ["cache_start_percent", "float", 0, 1],
  ["cache_end_percent", "float", 0, 1],
  ["cache_end_percent", "order", "cache_start_percent"],
  ["cache_threshold", "float", 0, 10],
]);

/** Every Schedule field (dataclass order) with its default; schedule_text may set any of them. */
export const SCHEDULE_FIELD_DEFAULTS = Object.freeze({
  strategy: "todo", ratios: {}, protect_blocks: 2, ramp_start: 3, ramp_step: 0.0, ramp_every: 2, ramp_cap: 0.5,
  start_percent: 0.0, end_percent: 1.0, adaptive: 0.0, pool: "avg", sx: 2, sy: 2, dit_ratio: 0.0, seed: 0,
  telemetry_jsonl: "", time_calls: false, device_aware: false, cache_interval: 0, cache_depth: 2,
  cache_start_percent: 0.0, cache_end_percent: 1.0, cache_threshold: 0.0,
});
const FLOAT_DEFAULTS = new Set(["ramp_step", "start_percent", "end_percent", "adaptive", "dit_ratio", "cache_start_percent", "cache_end_percent", "cache_threshold"]);

/** A number as Python's json module gives it: an int (exact, BigInt) or a float. */
class PyNumber {
  constructor(kind, value) {
    this.kind = kind; // "int" | "float"
    this.value = value; // BigInt for int, number for float
  }
}

const isInt = (v) => v instanceof PyNumber && v.kind === "int";
const isNum = (v) => v instanceof PyNumber;

/** A JS value (number, string, ...) as Python would hold it: whole numbers of a float field stay floats. */
export function pyValue(v, float = false) {
  if (typeof v === "number") return Number.isInteger(v) && !float ? new PyNumber("int", BigInt(v)) : new PyNumber("float", v);
  return v;
}

/** Python's repr() of a float: shortest round-trip digits, "1.0", "1e-05", "inf", "nan". */
export function pyFloat(x) {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mant, exp] = x.toExponential().split("e");
  const e = Number(exp);
  if (e < -4 || e >= 16) return `${mant}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  const s = String(x); // plain digits in this exponent range, as Python prints them
  return s.includes(".") ? s : `${s}.0`;
}

// What Python's repr() escapes: characters str.isprintable() rejects (other, separators), the space excepted.
const NOT_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

function pyStr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = "";
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (ch === "\\" || ch === quote) out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch !== " " && NOT_PRINTABLE.test(ch)) {
      const [prefix, width] = c < 0x100 ? ["x", 2] : c < 0x10000 ? ["u", 4] : ["U", 8];
      out += `\\${prefix}${c.toString(16).padStart(width, "0")}`;
    } else out += ch;
  }
  return `${quote}${out}${quote}`;
}

/** reprlib.Repr as scheduling/schedule.py `echo` sets it up (maxlevel 2, 4 items, 40-digit ints, `limit` chars). */
function boundedRepr(v, limit, level = 2) {
  if (v === null || v === undefined) return "None";
  if (v === true) return "True";
  if (v === false) return "False";
  if (v instanceof PyNumber) {
    if (v.kind === "float") return pyFloat(v.value);
    const s = v.value.toString();
    if (s.length <= 40) return s;
    const i = Math.max(0, Math.floor((40 - 3) / 2));
    const j = Math.max(0, 40 - 3 - i);
    return `${s.slice(0, i)}...${s.slice(s.length - j)}`;
  }
  if (typeof v === "number") return boundedRepr(pyValue(v), limit, level);
  if (typeof v === "string") {
    let s = pyStr(v);
    if (s.length > limit) {
      const i = Math.max(0, Math.floor((limit - 3) / 2));
      const j = Math.max(0, limit - 3 - i);
      s = pyStr(v.slice(0, i) + v.slice(v.length - j));
      s = `${s.slice(0, i)}...${s.slice(s.length - j)}`;
    }
    return s;
  }
  if (Array.isArray(v)) {
    if (!v.length) return "[]";
    if (level <= 0) return "[...]";
    const parts = v.slice(0, 4).map((x) => boundedRepr(x, limit, level - 1));
    if (v.length > 4) parts.push("...");
    return `[${parts.join(", ")}]`;
  }
  if (typeof v === "object") {
    const keys = Object.keys(v);
    if (!keys.length) return "{}";
    if (level <= 0) return "{...}";
    keys.sort(pySort); // reprlib sorts a dict's keys when it can
    const parts = keys.slice(0, 4).map((k) => `${boundedRepr(k, limit, level - 1)}: ${boundedRepr(v[k], limit, level - 1)}`);
    if (keys.length > 4) parts.push("...");
    return `{${parts.join(", ")}}`;
  }
  return String(v);
}

/** scheduling/schedule.py echo(): a short repr of user input for an error message. */
export function echo(value, limit = 80) {
  const short = boundedRepr(value, limit);
  return short.length <= limit ? short : `${short.slice(0, limit - 3)}...`;
}

function pyTypeName(v) {
  if (v === null) return "NoneType";
  if (typeof v === "boolean") return "bool";
  if (v instanceof PyNumber) return v.kind;
  if (typeof v === "string") return "str";
  if (Array.isArray(v)) return "list";
  return "dict";
}

function bound(x, kind) {
  return kind === "int" ? String(x) : pyFloat(x);
}

function rangeError(name, value, kind, lo, hi) {
  const ok = kind === "int" ? isInt(value) : isNum(value) && (value.kind === "int" || Number.isFinite(value.value));
  // BigInt and Number compare exactly in JS, as int and float do in Python
  if (ok && lo <= value.value && value.value <= hi) return null;
  return `Schedule field '${name}' must be ${kind === "int" ? "an integer" : "a number"} in [${bound(lo, kind)}, ${bound(hi, kind)}], got ${echo(value)}`;
}

function pyReprNumber(v) {
  return v.kind === "int" ? v.value.toString() : pyFloat(v.value);
}

/** Python's int() of a str: optional sign, digits with single underscores between, surrounding whitespace. */
function pyIntOfString(s) {
  const m = /^\s*([+-]?)(\d+(?:_\d+)*)\s*$/.exec(s);
  return m ? Number(BigInt(m[1] + m[2].replaceAll("_", ""))) : null;
}

function nestingDepth(text) {
  let depth = 0;
  let deepest = 0;
  for (const ch of text) {
    if (ch === "[" || ch === "{") deepest = Math.max(deepest, ++depth);
    else if (ch === "]" || ch === "}") depth = Math.max(0, depth - 1);
  }
  return deepest;
}

const NUMBER_OR_STRING = /"(?:[^"\\]|\\.)*"|-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?|-?Infinity|NaN/g;
const MARK = "\u0000tokenfuse-number:";
const KEY_MARK = "\u0000tokenfuse-key:"; // keeps every key non-integer-like while parsing: insertion order holds
const KEY_ORDER = Symbol("tokenfuse.keyOrder");

/** A parsed mapping's [key, value] pairs in the text's order (Python's dict order; duplicates: the last value). */
export function entriesInTextOrder(obj) {
  const order = obj?.[KEY_ORDER];
  return order ? order.map((k) => [k, obj[k]]) : Object.entries(obj ?? {});
}

/** An object parsed with marked keys, with its real keys, and their text order kept under KEY_ORDER. */
function unmarkKeys(marked) {
  const out = {};
  const order = [];
  for (const key of Object.keys(marked)) {
    const real = key.slice(KEY_MARK.length);
    // defineProperty: a "__proto__" key stays a key, as in JSON.parse and Python
    Object.defineProperty(out, real, { value: marked[key], enumerable: true, writable: true, configurable: true });
    order.push(real);
  }
  Object.defineProperty(out, KEY_ORDER, { value: order });
  return out;
}

/**
 * Python's json.loads for schedule text: numbers keep Python's int / float split (ints exact), NaN and Infinity
 * are accepted as Python accepts them. Returns {ok: true, data} or {ok: false} when the text is not JSON.
 */
export function parseJsonLikePython(text) {
  const marked = text.replace(NUMBER_OR_STRING, (tok, frac, exp, offset, whole) => {
    if (tok.startsWith('"')) {
      if (!/^\s*:/.test(whole.slice(offset + tok.length))) return tok;
      try {
        return JSON.stringify(KEY_MARK + JSON.parse(tok)); // a key: marked so JS keeps the text's order
      } catch {
        return tok; // not a JSON string: JSON.parse below refuses the text
      }
    }
    const kind = frac !== undefined || exp !== undefined || /Infinity|NaN/.test(tok) ? "float" : "int";
    return JSON.stringify(`${MARK}${kind}:${tok}`);
  });
  try {
    const data = JSON.parse(marked, (_key, v) => {
      if (v && typeof v === "object" && !Array.isArray(v) && !(v instanceof PyNumber)) return unmarkKeys(v);
      if (typeof v !== "string" || !v.startsWith(MARK)) return v;
      const [kind, tok] = v.slice(MARK.length).split(/:(.*)/s);
      if (kind === "int") return new PyNumber("int", BigInt(tok));
      const x = tok === "NaN" ? NaN : tok === "Infinity" ? Infinity : tok === "-Infinity" ? -Infinity : Number(tok);
      return new PyNumber("float", x);
    });
    return { ok: true, data };
  } catch {
    return { ok: false };
  }
}

const isMapping = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof PyNumber);
const isWidgetKey = (data, key) => (key === "strategy" ? data.strategy === "preset" : key === "preset" || key === "ratio");

/**
 * The widget values a schedule_text sets by name, checked as scheduling/widgets.py widgets_from_text checks them
 * (preset, then ratio; the first failing one names the error). Text the server refuses before reading it (too long,
 * too deep), text that is not JSON and text that is not a mapping set nothing here: checkScheduleText reports them.
 *
 * @returns {{widgets: {preset?: string, strategy?: string, ratio?: number}, error: string|null}}
 */
export function widgetsFromText(textValue) {
  const none = { widgets: {}, error: null };
  if (typeof textValue !== "string") return none;
  const text = textValue.trim();
  if (!text || text.length > SCHEDULE_TEXT_MAX_CHARS || nestingDepth(text) > SCHEDULE_TEXT_MAX_DEPTH) return none;
  const parsed = parseJsonLikePython(text);
  if (!parsed.ok || !isMapping(parsed.data)) return none;
  const data = parsed.data;
  const widgets = {};
  if (Object.hasOwn(data, "preset")) {
    const v = data.preset;
    if (typeof v !== "string" || !PRESETS.includes(v)) {
      return { widgets: {}, error: `schedule_text 'preset' must be one of (${PRESETS.map((p) => `'${p}'`).join(", ")}), got ${echo(v)}` };
    }
    widgets.preset = v;
  }
  if (Object.hasOwn(data, "ratio")) {
    const v = data.ratio;
    const ok = isNum(v) && (v.kind === "int" || Number.isFinite(v.value)) && 0 <= v.value && v.value <= MAX_RATIO;
    if (!ok) return { widgets: {}, error: `schedule_text 'ratio' must be a number in [0.0, ${pyFloat(MAX_RATIO)}], got ${echo(v)}` };
    widgets.ratio = Number(v.value);
  }
  if (data.strategy === "preset") widgets.strategy = "preset";
  return { widgets, error: null };
}

/** The mapping without the widget keys (widgetsFromText reads those), its keys' text order kept. */
function withoutWidgetKeys(data) {
  const out = {};
  const order = entriesInTextOrder(data).map(([k]) => k).filter((k) => !isWidgetKey(data, k));
  for (const key of order) Object.defineProperty(out, key, { value: data[key], enumerable: true, writable: true, configurable: true });
  Object.defineProperty(out, KEY_ORDER, { value: order });
  return out;
}

/**
 * The schedule fields a schedule_text sets, validated as the server validates them on top of `base` (the widgets'
 * schedule, in Schedule field names; missing fields take the Schedule defaults). The widget keys (WIDGET_KEYS) are
 * left out: widgetsFromText reads them, and `base` already holds what they set.
 *
 * @returns {{fields: object|null, error: string|null, yaml: boolean}} fields: the text's overrides as plain JS
 *   values (ratios keyed by level number); yaml: the text is not JSON (the server reads it as YAML; not checked here)
 */
export function checkScheduleText(textValue, base = {}) {
  if (typeof textValue !== "string") return { fields: null, error: `schedule text must be a string, got ${pyTypeName(textValue)}`, yaml: false };
  const text = textValue.trim();
  if (!text) return { fields: {}, error: null, yaml: false };
  if (text.length > SCHEDULE_TEXT_MAX_CHARS) {
    return {
      fields: null,
      error: `schedule text is ${text.length} characters; at most ${SCHEDULE_TEXT_MAX_CHARS} are accepted (a schedule has ${Object.keys(SCHEDULE_FIELD_DEFAULTS).length} fields)`,
      yaml: false,
    };
  }
  if (nestingDepth(text) > SCHEDULE_TEXT_MAX_DEPTH) {
    return {
      fields: null,
      error: `schedule text is nested deeper than ${SCHEDULE_TEXT_MAX_DEPTH} levels; a schedule is a flat mapping of fields (only 'ratios' holds a mapping)`,
      yaml: false,
    };
  }
  const parsed = parseJsonLikePython(text);
  if (!parsed.ok) return { fields: null, error: null, yaml: true };
  if (parsed.data === null) return { fields: {}, error: null, yaml: false };
  if (!isMapping(parsed.data)) {
    return { fields: null, error: `schedule text must be a mapping of fields, got ${pyTypeName(parsed.data)}`, yaml: false };
  }
  const data = withoutWidgetKeys(parsed.data);
  if (!Object.keys(data).length) return { fields: {}, error: null, yaml: false };
  const error = validate(data, base);
  if (error) return { fields: null, error, yaml: false };
  const fields = plain(data);
  if ("ratios" in fields) {
    // the levels as Schedule keeps them: int keys, the last of duplicates ("8" and "08") in the text's order wins
    fields.ratios = Object.fromEntries(entriesInTextOrder(data.ratios).map(([k, x]) => [pyIntOfString(k), plain(x)]));
  }
  return { fields, error: null, yaml: false };
}

function validate(data, base) {
  const names = Object.keys(SCHEDULE_FIELD_DEFAULTS);
  const unknown = Object.keys(data).filter((k) => !names.includes(k) && !WIDGET_KEYS.includes(k)).sort(pySort);
  if (unknown.length) {
    const shown = unknown.slice(0, 5).map((k) => echo(k, 40));
    if (unknown.length > 5) shown.push(`... ${unknown.length - 5} more`);
    const quoted = (list) => `[${[...list].sort(pySort).map((n) => `'${n}'`).join(", ")}]`;
    return `unknown Schedule field(s) [${shown.join(", ")}]; allowed: the widgets ${quoted(WIDGET_KEYS)} and the fields ${quoted(names)}`;
  }
  const v = {};
  for (const name of names) {
    const given = name in data ? data[name] : name in base ? base[name] : SCHEDULE_FIELD_DEFAULTS[name];
    v[name] = name in data ? given : pyValue(given, FLOAT_DEFAULTS.has(name));
  }
  if (typeof v.strategy !== "string" || !STRATEGIES.includes(v.strategy)) {
    return `Schedule field 'strategy' must be one of (${STRATEGIES.map((s) => `'${s}'`).join(", ")}), got ${echo(v.strategy)}`;
  }
  if (typeof v.pool !== "string" || !POOL_MODES.includes(v.pool)) {
    return `Schedule field 'pool' must be one of (${POOL_MODES.map((s) => `'${s}'`).join(", ")}), got ${echo(v.pool)}`;
  }
  const ratios = v.ratios;
  if (!ratios || typeof ratios !== "object" || Array.isArray(ratios) || ratios instanceof PyNumber) {
    return `Schedule field 'ratios' must be a mapping {level: ratio}, got ${echo(ratios)}`;
  }
  for (const [key, value] of entriesInTextOrder(ratios)) {
    const level = typeof key === "number" ? key : pyIntOfString(key);
    if (!LEVELS.includes(level)) return `Schedule field 'ratios' keys must be level factors (${LEVELS.join(", ")}), got ${echo(key)}`;
    const err = rangeError(`ratios[${level}]`, pyValue(value), "float", 0, MAX_RATIO);
    if (err) return err;
  }
  for (const [name, kind, lo, hi] of FIELD_CHECKS) {
    const value = v[name];
    if (kind === "int" || kind === "float") {
      const err = rangeError(name, value, kind, lo, hi);
      if (err) return err;
    } else if (kind === "order") {
      const start = v[lo];
      if (value.value < start.value) return `Schedule field '${name}' must be >= ${lo} (${pyReprNumber(start)}), got ${pyReprNumber(value)}`;
    } else if (kind === "bool") {
      if (typeof value !== "boolean") return `Schedule field '${name}' must be true or false, got ${echo(value)}`;
    } else if (kind === "telemetry") {
      if (typeof value !== "string" || (value && (value.includes("..") || !TELEMETRY_NAME.test(value)))) {
        return (
          "Schedule field 'telemetry_jsonl' must be a bare file name ending in .jsonl (letters, digits, '_', '-'," +
          ` '.'; at most 102 characters; no folders), written to ComfyUI's output/tokenfuse/ folder; got ${echo(value)}`
        );
      }
    }
  }
  return null;
}

// Python sorts str by code point; JS's < compares UTF-16 units, which puts U+10000 and above before U+E000..U+FFFF.
function pySort(a, b) {
  const x = Array.from(a, (ch) => ch.codePointAt(0));
  const y = Array.from(b, (ch) => ch.codePointAt(0));
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

function plain(v) {
  if (v instanceof PyNumber) return Number(v.value);
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === "object") {
    const out = {};
    for (const [k, x] of Object.entries(v)) out[k] = plain(x);
    return out;
  }
  return v;
}
