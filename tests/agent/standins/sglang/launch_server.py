"""Stand-in for `python -m sglang.launch_server`: exact flags (no abbreviations), metrics only with --enable-metrics."""

import argparse

from _standin_http import serve


def main() -> None:
    p = argparse.ArgumentParser(prog="sglang.launch_server", allow_abbrev=False)
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--context-length", type=int)
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--quantization")
    p.add_argument("--chat-template")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--lora-paths", nargs="+")
    p.add_argument("--max-loras-per-batch", type=int)
    ns = p.parse_args()
    labels = f'model_name="{ns.served_model_name or ns.model_path}"'
    metrics = "".join(
        f"# TYPE {n} {t}\n{n}{{{labels}}} {v}\n"
        for n, t, v in [
            ("sglang:num_running_reqs", "gauge", 0),
            ("sglang:num_queue_reqs", "gauge", 0),
            ("sglang:token_usage", "gauge", 0.0),
            ("sglang:prompt_tokens_total", "counter", 0),
            ("sglang:generation_tokens_total", "counter", 0),
        ]
    )
    serve(
        ns.host,
        ns.port,
        name="sglang",
        model=ns.served_model_name or ns.model_path,
        metrics_path="/metrics" if ns.enable_metrics else None,
        metrics_text=metrics,
        api_key=ns.api_key,
        warmup_s=0.5,
    )


if __name__ == "__main__":
    main()
