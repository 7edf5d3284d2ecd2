"""Python client for the modelless HTTP API.

from modelless.client import Client
client = Client("http://127.0.0.1:8080", api_key="mlk_…")
reply = client.online_query(image, app_id="digits", latency=5, accuracy=0.95)
print(reply["variant"], reply["predictions"])
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np


class ModellessClientError(Exception):
    """An error reply: the HTTP status and the server's code, message and details."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class Client:
    def __init__(
        self, url: str, api_key: str | None = None, admin_key: str | None = None, timeout_s: float = 60.0
    ) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._admin_key = admin_key
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, admin: bool = False, **kwargs: Any) -> Any:
        key = self._admin_key if admin else self._api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = self._http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json().get("error", {})
            except ValueError:
                error = {"message": response.text}
            raise ModellessClientError(
                response.status_code,
                error.get("code", "error"),
                error.get("message", ""),
                error.get("details"),
            )
        return response.json() if response.content else None

    def health(self) -> bool:
        try:
            return bool(self._call("GET", "/health")["status"] == "ok")
        except (httpx.HTTPError, ModellessClientError):
            return False

    def create_app(self, app_id: str, offline_buckets: list[str] | None = None) -> str:
        """Create an app (admin key) and return its API key, shown only this once."""
        body: dict[str, Any] = {"appID": app_id}
        if offline_buckets is not None:
            body["offlineBuckets"] = offline_buckets
        return str(self._call("POST", "/v1/apps", admin=True, json=body)["apiKey"])

    def set_offline_buckets(self, app_id: str, buckets: list[str]) -> list[str]:
        """Admin: the S3 buckets the app's offline jobs may read and write."""
        reply = self._call("PUT", f"/v1/apps/{app_id}/offline-buckets", admin=True, json={"buckets": buckets})
        return list(reply["buckets"])

    def register_model(
        self,
        model_name: str,
        model: Path | bytes | Any,
        val_set: Path | bytes,
        app_id: str,
        metric: str = "top1",
    ) -> dict[str, Any]:
        """Register an ONNX file (path or bytes) or a PyTorch module, exported to ONNX here, on
        the client, so that the server never loads a pickle."""
        valset_bytes = val_set.read_bytes() if isinstance(val_set, Path) else val_set
        if isinstance(model, Path):
            model_bytes = model.read_bytes()
        elif isinstance(model, bytes):
            model_bytes = model
        else:
            model_bytes = export_torch_module(model, valset_bytes)
        reply: dict[str, Any] = self._call(
            "POST",
            "/v1/register_model",
            data={"appID": app_id, "modelName": model_name, "metric": metric},
            files={
                "model": (f"{model_name}.onnx", model_bytes, "application/octet-stream"),
                "valSet": ("valset.npz", valset_bytes, "application/octet-stream"),
            },
        )
        return reply

    def registrations(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/registrations")["registrations"])

    def import_profiles(self, model_name: str, profiles: list[dict[str, Any]], app_id: str) -> list[str]:
        """Import profiles measured on hardware the deployment lacks (see ``modelless import-profiles``)."""
        body = {"appID": app_id, "modelName": model_name, "profiles": profiles}
        return list(self._call("POST", "/v1/variants/import", json=body)["imported"])

    def registration(self, registration_id: str) -> dict[str, Any]:
        reply: dict[str, Any] = self._call("GET", f"/v1/registrations/{registration_id}")
        return reply

    def wait_for_registration(
        self,
        registration_id: str,
        timeout_s: float = 900.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.5,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.registration(registration_id)
            if on_progress is not None:
                on_progress(status)
            if status["status"] in {"ready", "failed"}:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"registration {registration_id} not finished after {timeout_s} s")
            time.sleep(poll_s)

    def online_query(
        self,
        inputs: Any,
        app_id: str,
        latency: float | None = None,
        accuracy: float | None = None,
        model_name: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "appID": app_id,
            "inputs": inputs.tolist() if isinstance(inputs, np.ndarray) else inputs,
        }
        if latency is not None:
            body["latency"] = latency
        if accuracy is not None:
            body["accuracy"] = accuracy
        if model_name is not None:
            body["modelName"] = model_name
        reply: dict[str, Any] = self._call("POST", "/v1/online_query", json=body)
        return reply

    def offline_query(
        self,
        input_path: str,
        output_path: str,
        app_id: str,
        accuracy: float | None = None,
        model_name: str | None = None,
    ) -> dict[str, Any]:
        """INFaaS ``offline_query``: a batch job over every object under ``input_path``
        (``s3://bucket/prefix``); one result per input lands under ``output_path``. Returns the
        job at once (``wait_for_job`` follows it to the end)."""
        body: dict[str, Any] = {"appID": app_id, "inputPath": input_path, "outputPath": output_path}
        if accuracy is not None:
            body["accuracy"] = accuracy
        if model_name is not None:
            body["modelName"] = model_name
        reply: dict[str, Any] = self._call("POST", "/v1/offline_query", json=body)
        return reply

    def job(self, job_id: str) -> dict[str, Any]:
        reply: dict[str, Any] = self._call("GET", f"/v1/jobs/{job_id}")
        return reply

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/jobs")["jobs"])

    def wait_for_job(
        self,
        job_id: str,
        timeout_s: float = 3600.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 1.0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.job(job_id)
            if on_progress is not None:
                on_progress(status)
            if status["status"] in {"completed", "failed"}:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout_s} s")
            time.sleep(poll_s)

    def variants(self, model_name: str | None = None) -> list[dict[str, Any]]:
        params = {"modelName": model_name} if model_name else {}
        return list(self._call("GET", "/v1/variants", params=params)["variants"])

    def models(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/models")["models"])

    def workers(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/workers")["workers"])


def export_torch_module(module: Any, valset_npz: bytes) -> bytes:
    """A ``torch.nn.Module`` (or TorchScript module) as ONNX with a dynamic batch dimension,
    traced on the validation set's first input. torch is needed only on this path."""
    import io
    import tempfile

    import torch

    with np.load(io.BytesIO(valset_npz), allow_pickle=False) as data:
        example = torch.from_numpy(data["inputs"][:1].astype(np.float32))
    module.eval()
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        target = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module,
            (example,),
            target,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        return target.read_bytes()
