"""The tiny model trained on the standard library's sources: a tokenizer that spells any text,
weights that learnt something, the same weights from the same seed, and the texts it leaves
for calibration and for quality checks."""

import hashlib
import json

import pytest

from speedsplit.models import corpus, train
from speedsplit.models.checkpoint import synthesize
from speedsplit.models.prompts import exact_prompt, load_tokenizer, word_ids
from speedsplit.core.errors import ConfigError
from speedsplit.planning import config as C

SHORT = {"steps": 60, "seq_len": 64, "batch": 8, "warmup_steps": 5}


def test_the_corpus_is_split_by_file_and_names_what_it_is():
    c = corpus.stdlib_corpus(train_bytes=200_000, held_out_bytes=50_000)
    assert 150_000 < len(c.train) <= 200_000 and 25_000 < len(c.held_out) <= 50_000
    assert c.identity["corpus"] == "python-stdlib" and c.identity["files"]["held_out"] > 0
    assert c.held_out[:2000] not in c.train  # a held-out file is never trained on
    again = corpus.stdlib_corpus(train_bytes=200_000, held_out_bytes=50_000)
    assert again.identity == c.identity


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "fp16"
    info = synthesize("tiny", out, weights="trained", seed=0, training=SHORT)
    return out, info


def test_a_trained_model_learns_and_says_how(trained):
    out, info = trained
    assert info == {"source": "synthetic", "shape": "tiny", "weights": "trained", "seed": 0, "tokenizer": "bpe"}
    report = json.loads((out / "speedsplit-model.json").read_text())["training"]
    assert report["steps"] == 60 and report["corpus"]["corpus"] == "python-stdlib"
    # 1,024 tokens: chance is ln(1024) = 6.93 nats; 60 short steps already learn the common ones
    assert report["loss_first"] > 6.0 and report["loss_last"] < report["loss_first"] - 1.0
    assert report["held_out_perplexity"] < 400
    assert (out / train.HELD_OUT_TEXT).stat().st_size > 100_000 and (out / train.TRAIN_SAMPLE_TEXT).is_file()


def test_its_tokenizer_spells_code_and_builds_every_kind_of_prompt(trained):
    out, _ = trained
    tok = load_tokenizer(out)
    text = "def f(x):\n    return x  # é\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.vocab_size == 1024
    import random

    rng = random.Random(0)
    for n in (8, 64, 512):
        assert len(tok.encode(exact_prompt(tok, n, rng), add_special_tokens=False)) == n
    assert len(word_ids(tok, random.Random(0))) >= 16  # trace prompts share blocks of whole words


@pytest.mark.slow  # a second training run (8 s on 2 cores): make test, not the fast tier
def test_the_same_seed_trains_the_same_weights(trained, tmp_path):
    out, _ = trained
    again = tmp_path / "again"
    synthesize("tiny", again, weights="trained", seed=0, training=SHORT)

    def digest(folder):
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    assert digest(again) == digest(out)
    assert (again / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()


def test_only_the_tiny_and_small_synthetic_shapes_are_trained_the_small_ones_on_a_card(tmp_path):
    cfg = tmp_path / "big.yaml"
    cfg.write_text("models:\n  big: {source: synthetic, shape: llama-3.1-8b, weights: trained}\n")
    with pytest.raises(ConfigError, match=r"models\.big\.weights: trained is for a synthetic model of shape tiny"):
        C.load(cfg)
    cfg.write_text("models:\n  small: {source: synthetic, shape: small, weights: trained}\n")
    with pytest.raises(ConfigError, match=r"models\.small\.shape: a trained small model trains on a CUDA card"):
        C.load(cfg)
    cfg.write_text("platform: cuda\nmodels:\n  small: {source: synthetic, shape: small, weights: trained}\n")
    assert C.load(cfg).models["small"].shape == "small"


@pytest.mark.slow  # a second training run (8 s on 2 cores): make test, not the fast tier
def test_a_time_bound_fits_the_schedule_to_the_steps_it_allows(tmp_path):
    t = train.Training(steps=1000, warmup_steps=20, max_s=60.0)
    # 30 steps in 6 s at 0.2 s a step: 54 s left hold 270 more
    assert train.fitted_steps(t, 30, 6.0, 0.2) == 300
    assert train.fitted_steps(t, 30, 6.0, 0.01) == 1000  # the configured steps at most
    assert train.fitted_steps(t, 30, 70.0, 0.2) == 31  # over time already: one more step
    assert train.fitted_steps(train.Training(steps=1000), 30, 6.0, 0.2) == 1000  # no bound
    assert train._lr(299, t, 300) == pytest.approx(t.lr * 0.1, rel=1e-3)  # the cosine ends at the fitted step
    out = tmp_path / "bounded"
    synthesize("tiny", out, weights="trained", seed=0, training={**SHORT, "steps": 100_000, "max_s": 2.0})
    report = json.loads((out / "speedsplit-model.json").read_text())["training"]
    assert report["steps"] == 100_000 and SHORT["warmup_steps"] + train.TIMED_STEPS < report["steps_done"] < 100_000
    assert report["tokens_seen"] == report["steps_done"] * SHORT["batch"] * SHORT["seq_len"]
    assert report["device"] == "cpu"


def test_an_installed_corpus_holds_the_packages_sources_beside_the_library():
    c = corpus.stdlib_corpus(train_bytes=3_000_000, held_out_bytes=50_000, installed=True)
    assert c.identity["corpus"] == "python-installed" and len(c.identity["roots"]) >= 2
    assert "import torch" in c.train or "import polars" in c.train or "import numpy" in c.train  # this venv's
    assert c.identity == corpus.stdlib_corpus(train_bytes=3_000_000, held_out_bytes=50_000, installed=True).identity
    alone = corpus.stdlib_corpus(train_bytes=3_000_000, held_out_bytes=50_000)
    assert alone.identity["roots"] == c.identity["roots"][:1] and alone.train != c.train
