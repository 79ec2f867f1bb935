"""Training-free token scheduling for diffusion attention (pure torch; never imports ComfyUI)."""
