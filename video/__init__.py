"""Video face fusion core (pure numpy/opencv/PyAV; never imports ComfyUI).

Streamed in bounded memory: `decode` reads frames in order from a path or binary file object, `tracks` /
`smooth` / `scenes` / `keyframes` turn per-frame detections into smoothed face tracks (pass 1), `flow` carries
a key frame's refined change to the frames between key frames, `driver` runs both passes and `encode` writes
H.264 with every audio stream copied packet by packet.
"""
