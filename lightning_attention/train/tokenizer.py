"""Byte-level tokenizer: a token is one UTF-8 byte (vocabulary 256, no unknown token, no training)."""

import codecs

import torch


class ByteTokenizer:
    """``encode(str) -> list[int]`` in [0, 256); ``decode(list[int]) -> str`` (invalid UTF-8 becomes U+FFFD)."""

    vocab_size = 256
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_tensor(self, text: str) -> torch.Tensor:
        """``[N]`` uint8 tensor of the UTF-8 bytes (no Python list: a 30 MB corpus encodes in milliseconds)."""
        return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def stream_decoder(self):
        """An incremental decoder for streaming: ``feed(id) -> str`` holds back an incomplete multi-byte character."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda token_id: decoder.decode(bytes([int(token_id)]))
