"""The mteb adapter: an embforge encoder runs an MTEB task offline from local files, scoring like the
sentence-transformers model that mteb wraps itself."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import requires_data

mteb = pytest.importorskip("mteb")


def test_encode_follows_the_protocol(tiny_encoder):
    from mteb.models.models_protocols import EncoderProtocol

    from embforge.evaluate.mteb import MTEBEncoder

    adapter = MTEBEncoder(tiny_encoder, name="tiny")
    assert isinstance(adapter, EncoderProtocol)
    batches = [{"text": ["a cat runs", "the sky"]}, {"text": ["a dog"]}]
    out = adapter.encode(batches, task_metadata=None, hf_split="test", hf_subset="default")
    expected = tiny_encoder.encode(["a cat runs", "the sky", "a dog"])
    np.testing.assert_allclose(out, expected, atol=1e-6)
    assert adapter.similarity(out, out).shape == (3, 3)
    assert adapter.mteb_model_meta.name == "embforge/tiny"
    with pytest.raises(ValueError, match="without a 'text' field"):
        adapter.encode([{"image": [1]}], task_metadata=None, hf_split="test", hf_subset="default")


@pytest.mark.integration
@requires_data
def test_banking77_classification_offline_matches_sentence_transformers(tiny_model_dir):
    from sentence_transformers import SentenceTransformer

    from embforge.data.builtin.banking77 import load_banking77
    from embforge.encoder import Encoder
    from embforge.evaluate.mteb import local_task, run_mteb

    train, test = load_banking77("train_all"), load_banking77("test")
    labels = train.labels()
    train = train.subset([int(i) for c in range(77) for i in np.flatnonzero(labels == c)[:8]])
    test = test.subset(list(range(0, len(test), 40)))
    task = local_task("Banking77Classification", {"train": train, "test": test})
    task.n_experiments = 2  # mteb's protocol (8 samples per label, logistic regression), fewer repeats
    ours = run_mteb(Encoder.load(tiny_model_dir), task)
    # the same task run by mteb on its own sentence-transformers wrapper of the same weights
    reference_task = local_task("Banking77Classification", {"train": train, "test": test})
    reference_task.n_experiments = 2
    reference = mteb.evaluate(
        SentenceTransformer(str(tiny_model_dir), device="cpu"),
        reference_task,
        cache=None,
        show_progress_bar=False,
    )
    expected = reference.task_results[0].scores["test"][0]["accuracy"]
    assert ours["accuracy"] == pytest.approx(100 * expected, abs=1e-6)
    assert 0 < ours["accuracy"] < 100
