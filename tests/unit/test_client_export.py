"""The client's export of PyTorch modules, and registration of what torch exports: tiny modules,
exported for real, then ingested (checked and test-run with onnxruntime) as the server does."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from modelless.api import create_app
from modelless.api.services import build_services
from modelless.client import Client, export_torch_module
from modelless.config import Settings
from modelless.exceptions import InvalidModelError
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.registration.ingest import IngestRequest, Limits, ingest
from modelless.types import TensorSpec

torch: Any = pytest.importorskip("torch")
nn: Any = torch.nn
Module: Any = nn.Module

LIMITS = Limits(64 * 1024 * 1024, 16 * 1024 * 1024)
VOCABULARY, LENGTH, CLASSES = 30, 8, 3


class TinyEncoder(Module):  # type: ignore[misc]
    """A BERT-shaped classifier: token ids and an attention mask (both int64) through an
    nn.TransformerEncoder, whose fused fast path (taken under torch.no_grad in eval mode) no
    exporter can translate."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(VOCABULARY, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
        hidden = self.encoder(self.embedding(input_ids), src_key_padding_mask=attention_mask == 0)
        return self.head(hidden.mean(dim=1))


class BakedBatch(Module):  # type: ignore[misc]
    """Flattens with the batch size (1) written in: runs at batch 1 only."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x: Any) -> Any:
        return self.head(x.reshape(1, 8))


def token_valset(rows: int = 6) -> bytes:
    rng = np.random.default_rng(0)
    mask = np.ones((rows, LENGTH), np.int64)
    mask[:, -2:] = 0  # padding at the end, as a tokenizer leaves it
    buffer = io.BytesIO()
    # The mask first: the export passes the arrays to forward() by parameter name, not by order.
    np.savez(
        buffer,
        attention_mask=mask,
        input_ids=rng.integers(0, VOCABULARY, (rows, LENGTH)),
        labels=np.arange(rows) % CLASSES,
    )
    return buffer.getvalue()


def ingest_file(model: Path, valset: Path, work: Path) -> list[TensorSpec]:
    return list(ingest(IngestRequest(model, valset, work, LIMITS)).signature.inputs)


def test_a_transformer_encoder_with_two_int64_inputs_exports_with_a_dynamic_batch(tmp_path: Path) -> None:
    module = TinyEncoder()
    module.train()  # the export switches to eval mode and back
    exported = export_torch_module(module, token_valset(), tmp_path / "encoder.onnx")
    assert module.training
    assert [p.name for p in tmp_path.iterdir()] == ["encoder.onnx"]  # one file, no .onnx.data

    (tmp_path / "val.npz").write_bytes(token_valset())
    specs = ingest_file(exported, tmp_path / "val.npz", tmp_path / "work")  # test-run at batch 1 and 2
    assert specs == [
        TensorSpec("input_ids", [LENGTH], "int64"),
        TensorSpec("attention_mask", [LENGTH], "int64"),
    ]

    ids = np.random.default_rng(5).integers(0, VOCABULARY, (5, LENGTH))
    mask = np.ones((5, LENGTH), np.int64)
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    with torch.no_grad():
        module.eval()
        expected = module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_a_fixed_batch_export_from_torch_is_made_dynamic(tmp_path: Path) -> None:
    module = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, CLASSES)).eval()
    fixed = tmp_path / "fixed.onnx"
    # As a user exports without dynamic axes: the example's batch (2) is written into the graph.
    torch.onnx.export(module, (torch.zeros(2, 8),), str(fixed), dynamo=False, input_names=["x"])
    np.savez(tmp_path / "val.npz", inputs=np.ones((4, 8), np.float32), labels=np.zeros(4, np.int64))

    ingested = ingest(IngestRequest(fixed, tmp_path / "val.npz", tmp_path / "work", LIMITS))

    assert ingested.notes == ("the batch dimension every input and output fixed at 2 was made dynamic",)
    session = ort.InferenceSession(str(ingested.model), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((7, 8), np.float32)})[0].shape == (7, CLASSES)


def test_a_torch_export_that_bakes_in_the_batch_is_refused_with_how_to_re_export(tmp_path: Path) -> None:
    baked = tmp_path / "baked.onnx"
    torch.onnx.export(BakedBatch().eval(), (torch.zeros(1, 8),), str(baked), dynamo=False, input_names=["x"])
    np.savez(tmp_path / "val.npz", inputs=np.ones((4, 8), np.float32), labels=np.zeros(4, np.int64))

    with pytest.raises(InvalidModelError) as refused:
        ingest(IngestRequest(baked, tmp_path / "val.npz", tmp_path / "work", LIMITS))

    assert refused.value.message.startswith("the graph fixes the batch size at 1")
    assert "re-export with dynamic_axes={'x': {0: 'batch'}} or dynamic_shapes" in refused.value.message


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    settings = Settings(
        metadata_url="memory://",
        repository_url=str(tmp_path / "repo"),
        admin_key="admin",
        cache_dir=tmp_path / "cache",
        lambda_function="",
    )
    services = build_services(settings, store=InMemoryMetadataStore())
    services.registrar._background.submit = lambda *args, **kwargs: None  # type: ignore[method-assign,assignment]
    http = TestClient(create_app(services))
    key = Client("http://test", admin_key="admin")
    key._http = http  # type: ignore[assignment]
    api_key = key.create_app("text")
    client = Client("http://test", api_key=api_key)
    client._http = http  # type: ignore[assignment]
    try:
        yield client
    finally:
        http.close()
        services.close()


def test_client_registers_a_module_with_two_inputs_and_a_recipe_free_model(
    client: Client, tmp_path: Path
) -> None:
    valset = tmp_path / "val.npz"
    valset.write_bytes(token_valset())

    reply = client.register_model("encoder", TinyEncoder(), valset, "text")

    assert reply["status"] == "queued"
    [model] = client.models()
    assert [spec["name"] for spec in model["inputs"]] == ["input_ids", "attention_mask"]
    assert {spec["dtype"] for spec in model["inputs"]} == {"int64"}
