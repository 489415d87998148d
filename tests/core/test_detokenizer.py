"""Incremental detokenization and stop strings, through the engine loop with a
scripted model and real tokenizers."""

from __future__ import annotations

import pytest

from octavo.core.sampling_params import RequestOutputKind, SamplingParams
from octavo.core.tokenizer import load_tokenizer
from tests.fakes import scripted_engine

TEXT = "Grüße aus 日本 🎉! Café naïve — ok."


def stream(engine, prompt, params) -> list:
    engine.add_request("r", prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs


@pytest.fixture(scope="module")
def llama2(llama2_tokenizer_dir):
    return load_tokenizer(llama2_tokenizer_dir)


def test_multibyte_characters_stream_intact_llama2(llama2):
    script = llama2.encode(TEXT, add_special_tokens=False)
    # Byte-fallback pieces: the emoji is split over several tokens.
    assert any(llama2.convert_ids_to_tokens(t).startswith("<0x") for t in script)
    engine = scripted_engine(llama2, script)
    params = SamplingParams(max_tokens=len(script), ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    chunks = [o.outputs[0].text for o in stream(engine, "Hello", params)]
    assert all("\ufffd" not in chunk for chunk in chunks)
    # SentencePiece's "▁" on the first piece is a real space after the prompt.
    assert "".join(chunks) == " " + TEXT


def test_multibyte_characters_stream_intact_byte_level(tokenizer_dir):
    tokenizer = load_tokenizer(tokenizer_dir)
    script = tokenizer.encode(TEXT, add_special_tokens=False)
    engine = scripted_engine(tokenizer, script, vocab_size=tokenizer.vocab_size + 8)
    params = SamplingParams(max_tokens=len(script), ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    chunks = [o.outputs[0].text for o in stream(engine, "Hello", params)]
    assert all("\ufffd" not in chunk for chunk in chunks)
    assert "".join(chunks) == TEXT


def test_stop_string_across_token_boundaries(llama2):
    script = llama2.encode("The quick brown fox jumps over the lazy dog", add_special_tokens=False)
    pieces = llama2.convert_ids_to_tokens(script)
    # "own fox ju" spans three tokens ("▁brown", "▁fox", "▁jump"...).
    stop = "own fox ju"
    assert not any(stop in p.replace("▁", " ") for p in pieces)
    engine = scripted_engine(llama2, script)
    params = SamplingParams(max_tokens=len(script), ignore_eos=True, stop=[stop], output_kind=RequestOutputKind.DELTA)
    outputs = stream(engine, "Hi", params)
    text = "".join(o.outputs[0].text for o in outputs)
    assert text == " The quick br"
    final = outputs[-1].outputs[0]
    assert final.finish_reason == "stop" and final.stop_reason == stop
    # The stream never showed the start of the stop string.
    assert all("own" not in o.outputs[0].text for o in outputs)
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_blocks


def test_stop_string_kept_when_asked(llama2):
    script = llama2.encode("one two three four five", add_special_tokens=False)
    engine = scripted_engine(llama2, script)
    params = SamplingParams(max_tokens=20, ignore_eos=True, stop=["three"], include_stop_str_in_output=True)
    (final,) = [o for o in stream(engine, "Hi", params) if o.finished]
    assert final.outputs[0].text == " one two three"


def test_stop_token_ids_and_eos(llama2):
    script = llama2.encode("a b c d e f", add_special_tokens=False)
    stop_id = script[2]
    engine = scripted_engine(llama2, script)
    (final,) = stream(engine, "Hi", SamplingParams(max_tokens=20, stop_token_ids=[stop_id], output_kind=RequestOutputKind.FINAL_ONLY))
    assert final.outputs[0].token_ids == script[:3] and final.outputs[0].stop_reason == stop_id
    engine = scripted_engine(llama2, script, eos=frozenset({script[1]}))
    (final,) = stream(engine, "Hi", SamplingParams(max_tokens=20, output_kind=RequestOutputKind.FINAL_ONLY))
    assert final.outputs[0].token_ids == script[:2] and final.outputs[0].finish_reason == "stop"
    engine = scripted_engine(llama2, script, eos=frozenset({script[1]}))
    params = SamplingParams(max_tokens=4, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    (final,) = stream(engine, "Hi", params)
    assert final.outputs[0].token_ids == script[:4] and final.outputs[0].finish_reason == "length"


def test_min_tokens_defers_stop_strings(llama2):
    script = llama2.encode("stop here then stop again", add_special_tokens=False)
    engine = scripted_engine(llama2, script)
    params = SamplingParams(max_tokens=30, ignore_eos=True, stop=["stop"], min_tokens=3)
    (final,) = [o for o in stream(engine, "Hi", params) if o.finished]
    assert final.outputs[0].text == " stop here then "


def test_stop_string_output_logprobs_cover_the_kept_tokens(llama2):
    # "thr" ends inside the token "three": the text is cut, the token is kept.
    script = llama2.encode("one two three four five six", add_special_tokens=False)
    engine = scripted_engine(llama2, script)
    params = SamplingParams(max_tokens=20, ignore_eos=True, stop=["thr"], logprobs=0)
    (final,) = [o for o in stream(engine, "Hi", params) if o.finished]
    completion = final.outputs[0]
    assert completion.text == " one two "
    kept = len(completion.token_ids)
    assert len(completion.logprobs) == kept
    # Logprob of output i is -(i + 1): the sum over the kept tokens only.
    assert completion.cumulative_logprob == -sum(range(1, kept + 1))


@pytest.mark.parametrize("bytes_in_prompt", [1, 2, 3])
def test_prompt_ending_inside_a_character(llama2, bytes_in_prompt):
    # A token-id prompt may stop inside a byte-fallback character: the output
    # opens with that character once completed, never with the prompt's text.
    from octavo.core.detokenizer import IncrementalDetokenizer

    ids = llama2.encode("Hi \U0001d518 ok \U0001f389 done", add_special_tokens=False)
    first_byte = next(i for i, piece in enumerate(llama2.convert_ids_to_tokens(ids)) if piece.startswith("<0x"))
    cut = first_byte + bytes_in_prompt
    detokenizer = IncrementalDetokenizer(llama2, ids[:cut], SamplingParams(max_tokens=16))
    pieces = []
    for token_id in ids[cut:]:
        detokenizer.update([token_id], check_stop=False)
        pieces.append(detokenizer.get_next_output_text(finished=False, delta=True))
    assert detokenizer.output_text == "".join(pieces) == "\U0001d518 ok \U0001f389 done"
