"""The tiny set's tokenizer: a byte-level BPE built locally with Qwen's special tokens (see tiny.py)."""

from __future__ import annotations

# Qwen's special tokens, in Qwen's id order, appended after the BPE vocabulary.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# Words whose byte-level merge chains form the tiny BPE's merges (the rest of any text falls back to single bytes).
MERGE_WORDS = (" a", " cat", "cat", " the", " and", " video", " of", "Picture", " seconds", " dog", " on")

# A minimal Qwen-style chat template (H3 itself never applies one: it tokenizes its presentation verbatim).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_symbols() -> list[str]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the others map to code points from 256 up."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    symbols, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_tokenizer():
    from transformers import Qwen2TokenizerFast

    symbols = byte_symbols()
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    merges: list[tuple[str, str]] = []
    for word in MERGE_WORDS:
        pieces = [symbols[byte] for byte in word.encode("utf-8")]
        while len(pieces) > 1:
            pair = (pieces[0], pieces[1])
            merged = pair[0] + pair[1]
            if pair not in merges:
                merges.append(pair)
                vocab.setdefault(merged, len(vocab))
            pieces = [merged] + pieces[2:]

    # The special tokens get fixed ids right after the BPE vocabulary, in Qwen's order (the text encoder config
    # hard-codes the vision ones); otherwise the tokenizer would number them in the order it registers them.
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(SPECIAL_TOKENS),
        model_max_length=262144,
        chat_template=CHAT_TEMPLATE,
    )
    expected = {token: vocab[token] for token in SPECIAL_TOKENS}
    actual = dict(zip(SPECIAL_TOKENS, tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))))
    if actual != expected:  # the text encoder config hard-codes these ids
        raise RuntimeError(f"tiny tokenizer special-token ids moved: {actual} != {expected}")
    return tokenizer
