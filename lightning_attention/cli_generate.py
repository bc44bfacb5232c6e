"""``lightning-attention generate``: stream text from a trained checkpoint with constant memory.

The prompt is prefilled in one call; every further token is one recurrent step on the cached fp32 states (no KV
cache for TNL), so memory stays flat however long the generation runs. Accepts a ``lightning-attention train``
checkpoint directory (or its ``checkpoint.pt``) or a transformers ``save_pretrained`` directory of a TNL model.
"""

import argparse
import os
import sys
import time

import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="checkpoints/tnl",
                        help="checkpoint directory or file written by `train` (default: checkpoints/tnl, where a "
                             "plain `lightning-attention train` saves)")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    parser.add_argument("--max-new-tokens", type=int, default=300, help="tokens (bytes) to generate (default: 300)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default: 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads (default 1: a decode step is a few small matmuls, and a second spinning "
                             "OpenMP thread made steps ~100x slower on a shared 2-core machine)")
    parser.add_argument("--quiet", action="store_true", help="print only the generated text (no stats line)")


def load_any(path: str, device: str):
    """A model from a training checkpoint or a transformers directory, in eval mode."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        import lightning_attention.models.transnormer  # noqa: F401  (registers the Auto classes)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    from lightning_attention.train.checkpoint import load_model

    model, _ = load_model(path, device)
    return model


def run(args: argparse.Namespace) -> int:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _generate(args, device)
    finally:
        torch.set_num_threads(threads)


def _generate(args: argparse.Namespace, device: str) -> int:
    from lightning_attention.models.sampling import stream_tokens
    from lightning_attention.train.tokenizer import ByteTokenizer

    model = load_any(args.checkpoint, device)
    tokenizer = ByteTokenizer()
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise SystemExit("--prompt must not be empty")
    ids = torch.tensor([prompt], device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    feed = tokenizer.stream_decoder()
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    start, count = time.perf_counter(), 0
    for token in stream_tokens(model, ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                               top_p=args.top_p, generator=generator):
        out.write(feed(token))
        out.flush()
        count += 1
    out.write("\n")
    if not args.quiet:
        elapsed = time.perf_counter() - start
        print(f"[{count} tokens in {elapsed:.2f} s, {count / max(elapsed, 1e-9):.1f} tokens/s]", file=sys.stderr)
    return 0
