// The pack's vocabulary for the browser code, generated from scheduling/vocabulary.py and
// scheduling/schedule.py by `python tools/gen_vocabulary_js.py`: edit those, not this file.

export const LEVELS = Object.freeze([8, 16, 32, 64]);
export const MAX_RATIO = 0.9;
export const PRESETS = Object.freeze(["off", "balanced", "lowvram_4gb", "lowvram_6gb", "lowvram_8gb"]);
export const PRESET_ORDER = Object.freeze(["off", "balanced", "lowvram_8gb", "lowvram_6gb", "lowvram_4gb"]);
export const STRATEGIES = Object.freeze(["tome", "todo", "topk"]);
export const STRATEGY_LABELS = Object.freeze({"todo": "ToDo K/V pooling", "tome": "ToMe token merging", "topk": "top-K keys"});
export const POOL_MODES = Object.freeze(["avg", "nearest"]);
export const FAMILIES = Object.freeze(["sd15", "sdxl", "dit"]);
export const FAMILY_LEVELS = Object.freeze({"sd15": [8, 16, 32, 64], "sdxl": [16, 32], "dit": []});
