"""What tests, benches and tools share (never imported by the pack at run time).

- pack_loader: load this checkout as package `tokenfuse` from a script (tests/conftest.py does it for pytest)
- standin: a seeded stand-in for the sampler (video tests, the ComfyUI-free Ray engine)
- comfy_models: random-weight ComfyUI U-Nets and SD VAE from ComfyUI's own classes (setup_comfy, build_model, build_vae)
- unet_bench: what the U-Net benches share (interleaved timing, memory peaks, TomePatchModel baseline, patch cost)
- astronaut: the astronaut photo with hand-built FACES
- bench_report: what the benches share when they report (the --json file, written atomically after every table)
- face_model/: the project's small trained face model (weights, training script, loader, quality measures)

Scripts put devkit/ on sys.path and import these modules by name (`import comfy_models`); tests import them as
`tokenfuse.devkit.<module>`.
"""
