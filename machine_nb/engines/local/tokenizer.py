"""The local model's tokenizer: special role tokens, one token per byte, and ~150 whole words.

It satisfies the small Tokenizer surface tinker-cookbook relies on (encode / decode /
eos_token_id / bos_token / name_or_path), so renderers, `conversation_to_datum` and token counts
work unchanged. Which words exist is decided once, at build time (machine_nb/engines/local/build.py
writes weights/vocab.json); the tokenizer always loads the vocabulary shipped with the weights.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

# Special tokens, in id order. <|end|> ends every message and is the sampling stop token.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|end|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
)

# Whole-word pieces, each with a leading space (the renderer puts a space before every message's
# text, so a reply's first word is the same token as in mid-sentence: " answer" in
# "The answer is 62." is the very token an `answer: 62` target starts with). Digits are never
# part of a word: numbers are always spelled digit by digit, which is what makes arithmetic learnable.
WORDS: tuple[str, ...] = tuple(
    " " + w
    for w in """
    What what How how much many Compute Calculate Add Subtract Please is are was be am
    plus minus equals sum difference of and between from take away get if you add subtract
    The the answer Answer answers result number numbers It it That that This this So
    capital France Paris Japan Tokyo Italy Rome Germany Berlin Spain Madrid England London
    Who who wrote Hamlet written by William Shakespeare color sky blue on a an clear day
    days in week There there legs does do spider have has largest planet Jupiter our solar
    system Water water made hydrogen oxygen bees Bees make honey Hello Hi hello help can Can
    I me my My your name Tiny small language model Yes yes No no need opposite hot cold
    freezing point freezes at degrees Celsius Give word rhymes with cat Hat primary colors
    red yellow Name three Three fruits apple banana cherry Short short earth round to for
    not or as will assistant user tool helpful You question questions Thank thanks welcome
    you're call calls think Sure here Here good morning
    Which which animal known king jungle lion season leaves Leaves fall trees autumn eight
    """.split()
)

_FIRST_BYTE_ID = len(SPECIAL_TOKENS)
_FIRST_WORD_ID = _FIRST_BYTE_ID + 256


class LocalTokenizer:
    """Greedy longest-match tokenizer over special tokens, whole words and single bytes.

    Any text encodes (characters outside printable ASCII fall back to their UTF-8 bytes), so token
    counts work on arbitrary data, and `decode(encode(text)) == text` for every string without
    lone surrogates. Digits are always single tokens.
    """

    def __init__(self, words: Sequence[str] = WORDS, special_tokens: Sequence[str] = SPECIAL_TOKENS,
                 name_or_path: str = "local/arith-tiny"):
        if tuple(special_tokens[:3]) != ("<|pad|>", "<|bos|>", "<|end|>"):
            raise ValueError("special_tokens must start with <|pad|>, <|bos|>, <|end|>")
        if not all(special_tokens) or len(set(special_tokens)) != len(special_tokens):
            raise ValueError("special tokens must be unique and not empty")
        bad = [w for w in words if not w or any(c.isdigit() for c in w) or len(w) < 2]
        if bad:
            raise ValueError(f"word pieces must be 2+ characters without digits: {bad[:5]}")
        if len(set(words)) != len(words):
            raise ValueError("word pieces must be unique")
        self.name_or_path = name_or_path
        self.special_tokens = tuple(special_tokens)
        self.words = tuple(words)
        self._first_byte = len(self.special_tokens)
        self._first_word = self._first_byte + 256
        self._special_ids = {t: i for i, t in enumerate(self.special_tokens)}
        self._word_ids = {w: self._first_word + i for i, w in enumerate(self.words)}
        # One token id -> its bytes (specials decode to their own text, as in HF tokenizers).
        self._id_bytes: list[bytes] = (
            [t.encode() for t in self.special_tokens]
            + [bytes([b]) for b in range(256)]
            + [w.encode() for w in self.words]
        )
        # Alternation ordered longest first: at each position the regex takes the longest word.
        by_len = sorted(self.words, key=len, reverse=True)
        self._word_re = re.compile("|".join(re.escape(w) for w in by_len))
        specials = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = re.compile("|".join(re.escape(t) for t in specials))

    # -- the HF-like surface tinker-cookbook touches --------------------------------------------
    pad_token = "<|pad|>"
    bos_token = "<|bos|>"
    eos_token = "<|end|>"
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2

    @property
    def vocab_size(self) -> int:
        return len(self._id_bytes)

    def __len__(self) -> int:
        return self.vocab_size

    def token_id(self, special: str) -> int:
        """The id of a special token such as "<|end|>" (KeyError names the known ones)."""
        try:
            return self._special_ids[special]
        except KeyError:
            raise KeyError(f"{special!r} is not a special token; known: {list(self.special_tokens)}") from None

    def encode(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False,
               **_: Any) -> list[int]:
        """Token ids for `text`.

        add_special_tokens: prepend <|bos|> (default False: the renderer adds it, as in the cookbook).
        split_special_tokens: encode "<|end|>"-like text as plain characters instead of the special
            token (default False, like Hugging Face tokenizers, so renderers may encode them by name).
        """
        ids: list[int] = [self.bos_token_id] if add_special_tokens else []
        if split_special_tokens:
            self._encode_plain(text, ids)
            return ids
        pos = 0
        for m in self._special_re.finditer(text):
            self._encode_plain(text[pos:m.start()], ids)
            ids.append(self._special_ids[m.group()])
            pos = m.end()
        self._encode_plain(text[pos:], ids)
        return ids

    def _encode_plain(self, text: str, out: list[int]) -> None:
        pos = 0
        for m in self._word_re.finditer(text):
            self._encode_bytes(text[pos:m.start()], out)
            out.append(self._word_ids[m.group()])
            pos = m.end()
        self._encode_bytes(text[pos:], out)

    def _encode_bytes(self, text: str, out: list[int]) -> None:
        if text:
            # surrogatepass: a lone surrogate still encodes (it decodes to U+FFFD), never raises
            out.extend(self._first_byte + b for b in text.encode("utf-8", "surrogatepass"))

    def decode(self, token_ids: Iterable[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """Text for `token_ids`; bytes that do not form valid UTF-8 (a cut sequence) become U+FFFD.

        skip_special_tokens: drop role/end tokens from the text (default False, as Hugging Face).
        Raises ValueError naming an id outside the vocabulary.
        """
        parts = []
        for i in token_ids:
            i = self._known(i)
            if skip_special_tokens and i < self._first_byte:
                continue
            parts.append(self._id_bytes[i])
        return b"".join(parts).decode("utf-8", "replace")

    def convert_ids_to_tokens(self, token_ids: Iterable[int]) -> list[str]:
        """Readable pieces, one per id (bytes outside printable ASCII shown as <0xNN>).
        Raises ValueError naming an id outside the vocabulary."""
        out = []
        for i in token_ids:
            i = self._known(i)
            if self._first_byte <= i < self._first_word and not (32 <= i - self._first_byte < 127):
                out.append(f"<0x{i - self._first_byte:02X}>")
            else:
                out.append(self._id_bytes[i].decode("utf-8", "replace"))
        return out

    def _known(self, token_id: Any) -> int:
        """`token_id` as an int; ValueError when it is outside the vocabulary."""
        i, n = int(token_id), len(self._id_bytes)
        if not 0 <= i < n:
            raise ValueError(f"token id {i} is outside the vocabulary (0..{n - 1})")
        return i

    def get_vocab(self) -> dict[str, int]:
        """Piece -> id, as `convert_ids_to_tokens` spells the pieces."""
        return {p: i for i, p in enumerate(self.convert_ids_to_tokens(range(self.vocab_size)))}

    # -- persistence ----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The vocabulary as plain data (what weights/vocab.json holds)."""
        return {"format": "machine_nb.local.vocab/1", "special_tokens": list(self.special_tokens),
                "byte_tokens": 256, "words": list(self.words)}

    def save(self, path: str | Path) -> None:
        """Write the vocabulary JSON (used by the build script; plain write, a build output)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    def to_hf(self) -> Any:
        """The same tokenizer as a Hugging Face `tokenizers.Tokenizer`, giving identical ids.

        Bytes map to GPT-2's byte-level alphabet; a Split pre-tokenizer isolates the whole words
        (longest first, as `encode` matches them) and a Unigram model over the byte and word
        pieces then keeps each word whole and spells everything between words byte by byte
        (no word fits inside such a gap). This is the form `transformers.AutoTokenizer` loads
        offline, which the tinker SDK's `get_tokenizer()` uses (see `save_hf`).
        """
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

        byte_char = _bytes_to_unicode()

        def level(text: str) -> str:
            return "".join(byte_char[b] for b in text.encode("utf-8"))

        vocab = ([(t, 0.0) for t in self.special_tokens] + [(byte_char[b], -10.0) for b in range(256)]
                 + [(level(w), 0.0) for w in self.words])
        tok = Tokenizer(models.Unigram(vocab, unk_id=None, byte_fallback=False))
        words = sorted((level(w) for w in self.words), key=len, reverse=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            pre_tokenizers.Split(Regex("|".join(re.escape(w) for w in words)), behavior="isolated")])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.special_tokens])
        return tok

    def save_hf(self, directory: str | Path) -> None:
        """Write a `PreTrainedTokenizerFast` directory (tokenizer.json + config) for `to_hf()`.

        `AutoTokenizer.from_pretrained(directory)` then loads it with no network; the local
        server reports that directory as the model's `tokenizer_id`. Used by the build script.
        """
        from transformers import PreTrainedTokenizerFast

        fast = PreTrainedTokenizerFast(tokenizer_object=self.to_hf(), bos_token=self.bos_token,
                                       eos_token=self.eos_token, pad_token=self.pad_token,
                                       model_max_length=128, clean_up_tokenization_spaces=False)
        fast.save_pretrained(str(directory))

    @classmethod
    def load(cls, path: str | Path, name_or_path: str = "local/arith-tiny") -> "LocalTokenizer":
        """Read a vocabulary JSON written by `save`; a malformed file raises MachineFormatError
        naming the file and, where one is at fault, the field."""
        from ...errors import MachineFormatError

        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MachineFormatError(str(path), f"cannot read the local model's vocabulary: {exc}") from exc
        if not isinstance(data, dict):
            raise MachineFormatError(str(path), f"expected a JSON object, got {type(data).__name__}")
        for key in ("special_tokens", "words"):
            if not isinstance(data.get(key), list) or not all(isinstance(t, str) for t in data[key]):
                raise MachineFormatError(str(path), "expected a list of strings", field=key)
        if data.get("byte_tokens") != 256:
            raise MachineFormatError(str(path), "expected 256 byte tokens", field="byte_tokens")
        try:
            cls(special_tokens=tuple(data["special_tokens"]), words=())
        except ValueError as exc:
            raise MachineFormatError(str(path), str(exc), field="special_tokens") from None
        try:
            return cls(tuple(data["words"]), tuple(data["special_tokens"]), name_or_path=name_or_path)
        except ValueError as exc:
            raise MachineFormatError(str(path), str(exc), field="words") from None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what `tokenizers`' ByteLevel uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars)))
