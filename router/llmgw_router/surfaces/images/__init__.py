"""OpenAI's images API (`/v1/images/generations`), served by ComfyUI servers as workflows."""
