"""``lightning-attention generate``: stream text from a trained checkpoint with constant memory.

Loads the checkpoint folder written by ``lightning-attention train`` (checksums verified) or any transformers folder
of a causal LM, and runs transformers' ``generate()`` with a ``TextStreamer``: the prompt is prefilled in one call and
every further token is one recurrent step on the cached fp32 states of the TNL layers (no KV cache), so memory and
time per token stay flat however long the generation runs.
"""

import argparse
import sys
import time

import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="checkpoints/tnl",
                        help="checkpoint folder written by `train`, or any transformers model folder (default: "
                             "checkpoints/tnl, where a plain `lightning-attention train` saves)")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=300, help="tokens to generate (default: 300)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default: 0, all)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default: 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu) | cpu | cuda")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: a decode step is a few small matmuls, and a second spinning "
                             "OpenMP thread made steps ~100x slower on a shared 2-core machine)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay every decode step after the prompt from a CUDA graph (TransNormer checkpoints; "
                             "on CUDA: several times the eager tokens/s at batch 1; elsewhere the eager step runs)")
    parser.add_argument("--quiet", action="store_true", help="print only the generated text (no stats line)")


def run(args: argparse.Namespace) -> int:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _generate(args, device)
    finally:
        torch.set_num_threads(threads)


def _generate(args: argparse.Namespace, device: str) -> int:
    from transformers import TextStreamer

    from lightning_attention.train.checkpoint import load_pretrained
    from lightning_attention.train.errors import UserError

    model, tokenizer = load_pretrained(args.checkpoint, device)
    if args.cuda_graphs:
        if not hasattr(model.config, "decode_cuda_graphs"):
            raise UserError(f"--cuda-graphs needs a TransNormer checkpoint, {args.checkpoint} holds a "
                            f"{type(model).__name__}")
        model.config.decode_cuda_graphs = True
    inputs = tokenizer(args.prompt, return_tensors="pt").to(device)
    prompt_tokens = inputs["input_ids"].shape[1]
    if prompt_tokens == 0:
        raise UserError("--prompt must not be empty")
    sampling = {"do_sample": False}
    if args.temperature > 0:
        sampling = {"do_sample": True, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    torch.manual_seed(args.seed)  # generate() samples from torch's global generator
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    start = time.perf_counter()
    streamer = TextStreamer(tokenizer, skip_prompt=True)
    out = model.generate(**inputs, max_new_tokens=args.max_new_tokens, streamer=streamer, **sampling)
    elapsed = time.perf_counter() - start
    count = out.shape[1] - prompt_tokens
    if not args.quiet:
        print(f"[{count} tokens in {elapsed:.2f} s, {count / max(elapsed, 1e-9):.1f} tokens/s]", file=sys.stderr)
    return 0
