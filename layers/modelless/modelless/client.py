"""Python client for the modelless HTTP API.

from modelless.client import Client
client = Client("http://127.0.0.1:8080", api_key="mlk_…")
reply = client.online_query(image, app_id="digits", latency=5, accuracy=0.95)
print(reply["variant"], reply["predictions"])
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

S3_SCHEME = "s3://"
# A registration answers once its model is checked and test-run: a gigabyte's takes a while.
REGISTER_TIMEOUT_S = 600.0
# The calls that create something (register_model, offline_query) carry an Idempotency-Key and
# are tried again with it, after these pauses, when their reply was lost: a dropped connection, a
# 502/503/504, or a 409 saying the first attempt still runs. The server answers a retry with the
# first attempt's reply, so nothing is created twice.
RETRY_DELAYS_S = (0.5, 1.0, 2.0)
RETRIED_STATUSES = frozenset({502, 503, 504})
IDEMPOTENCY_HEADER = "Idempotency-Key"


class ModellessClientError(Exception):
    """An error reply: the HTTP status and the server's code, message and details."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class RegistrationWaitTimeout(TimeoutError):
    """``Client.wait_for_registration`` stopped waiting; ``last`` is the registration's last reply
    (it goes on server-side)."""

    def __init__(self, message: str, last: dict[str, Any]) -> None:
        super().__init__(message)
        self.last = last


class Client:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        admin_key: str | None = None,
        timeout_s: float = 60.0,
        retry_delays_s: Sequence[float] = RETRY_DELAYS_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._admin_key = admin_key
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._retry_delays_s = tuple(retry_delays_s)
        self._sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(
        self,
        method: str,
        path: str,
        admin: bool = False,
        headers: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Any:
        key = self._admin_key if admin else self._api_key
        headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
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

    def _call_once(
        self,
        method: str,
        path: str,
        idempotency_key: str | None = None,
        rewind: Callable[[], None] = lambda: None,
        **kwargs: Any,
    ) -> Any:
        """A call that creates something, made at most once server-side: it carries an
        ``Idempotency-Key`` (``idempotency_key``, else a new UUID for this logical call) and is
        tried again with the same key after each of ``retry_delays_s`` while its reply is lost
        (see ``RETRY_DELAYS_S``). ``rewind``: puts the request's file parts back at their start
        before each try."""
        headers = {IDEMPOTENCY_HEADER: idempotency_key or str(uuid.uuid4())}
        for delay in (*self._retry_delays_s, None):
            rewind()
            try:
                return self._call(method, path, headers=headers, **kwargs)
            except httpx.TransportError:
                if delay is None:
                    raise
            except ModellessClientError as error:
                if delay is None or not _worth_retrying(error):
                    raise
            self._sleep(delay)
        raise AssertionError("unreachable: the last try returns or raises")

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
        model: Path | str | bytes | Any,
        valset: Path | str | bytes,
        app_id: str,
        metric: str = "top1",
        preprocessing: Mapping[str, Any] | None = None,
        model_data: Path | str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Register a model with its validation set (docs/REGISTRATION.md).

        ``model``: an ONNX file's path (or a zip/tar holding it with its external data), its
        bytes, an ``s3://bucket/key`` URI the server reads itself (the way in for large models, and
        the only one in AWS past a few MB), or a PyTorch module, exported to ONNX here, on the
        client, so that the server never loads a pickle. ``valset``: an ``.npz``'s path, bytes or
        ``s3://`` URI. ``model_data``: the model's external data file (``x.onnx.data``), a path
        or ``s3://`` URI. ``preprocessing``: the recipe that turns image bytes into the model's
        input. Files are streamed from disk, never read whole into memory here. The call carries
        ``idempotency_key`` (else a new UUID) and is retried with it when its reply is lost
        (``RETRY_DELAYS_S``): it registers the model once, whatever happens to the connection."""
        with contextlib.ExitStack() as opened:
            if _is_module(model):
                if isinstance(valset, str) and valset.startswith(S3_SCHEME):
                    raise ValueError(
                        "exporting a torch module needs the validation set here: a path or bytes"
                    )
                tmp = Path(opened.enter_context(tempfile.TemporaryDirectory(prefix="modelless-export-")))
                model = export_torch_module(
                    model, Path(valset) if isinstance(valset, str) else valset, tmp / f"{model_name}.onnx"
                )
            fields: dict[str, Any] = {"appID": app_id, "modelName": model_name, "metric": metric}
            files: dict[str, tuple[str, Any, str]] = {}
            parts = (
                ("model", "modelUri", model),
                ("valSet", "valSetUri", valset),
                ("modelData", "modelDataUri", model_data),
            )
            for part, uri_field, value in parts:
                if value is None:
                    continue
                if isinstance(value, str) and value.startswith(S3_SCHEME):
                    fields[uri_field] = value
                elif isinstance(value, bytes):
                    files[part] = (f"{model_name}-{part}", value, "application/octet-stream")
                else:
                    path = Path(value)
                    # An open file: httpx streams it in pieces as the request goes out.
                    files[part] = (
                        path.name,
                        opened.enter_context(path.open("rb")),
                        "application/octet-stream",
                    )

            def rewind() -> None:
                for _, content, _ in files.values():
                    if hasattr(content, "seek"):
                        content.seek(0)

            if files:
                if preprocessing is not None:
                    fields["preprocessing"] = json.dumps(dict(preprocessing))
                reply: dict[str, Any] = self._call_once(
                    "POST",
                    "/v1/register_model",
                    idempotency_key,
                    rewind,
                    data=fields,
                    files=files,
                    timeout=REGISTER_TIMEOUT_S,
                )
            else:
                if preprocessing is not None:
                    fields["preprocessing"] = dict(preprocessing)
                reply = self._call_once(
                    "POST", "/v1/register_model", idempotency_key, json=fields, timeout=REGISTER_TIMEOUT_S
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
        timeout_s: float | None = 900.0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        poll_s: float = 0.5,
        max_wait_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Follow a registration until it is ready or failed, for as long as it makes progress.

        ``timeout_s``: how long it may go without any (its status, its done count or a variant's
        state unchanged; None: no limit) — a registration of a large model may take long, but
        each of its profiles moves it on. ``max_wait_s``: an overall cap (None: none).
        ``on_progress`` gets every reply. Raises ``RegistrationWaitTimeout`` (a TimeoutError that
        carries the last reply) when either limit passes; the registration goes on server-side."""
        started = clock()
        last_change = started
        seen: tuple[object, ...] | None = None
        while True:
            reply = self.registration(registration_id)
            now = clock()
            progress = (reply.get("status"), reply.get("done"), sorted((reply.get("variants") or {}).items()))
            if progress != seen:
                seen, last_change = progress, now
            if on_progress is not None:
                on_progress(reply)
            if reply["status"] in {"ready", "failed"}:
                return reply
            if timeout_s is not None and now - last_change > timeout_s:
                raise RegistrationWaitTimeout(
                    f"registration {registration_id} made no progress for {timeout_s:g} s", reply
                )
            if max_wait_s is not None and now - started > max_wait_s:
                raise RegistrationWaitTimeout(
                    f"registration {registration_id} not finished after {max_wait_s:g} s", reply
                )
            sleep(poll_s)

    def online_query(
        self,
        inputs: Any,
        app_id: str,
        latency: float | None = None,
        accuracy: float | None = None,
        model_name: str | None = None,
        *,
        encoding: str = "npy",
    ) -> dict[str, Any]:
        """Run a query (docs/QUERIES.md). ``encoding="npy"`` (the default) sends the inputs
        binary, with the app and targets in the query string: an array as ``.npy`` (as it is:
        send float32 to a float32 model), a dict of arrays (one per input name) as ``.npz``, the
        bytes of a PNG or JPEG file as that image; ``encoding="json"`` sends today's JSON body.
        The reply is the server's, plus ``clientTimingsMs``: ``encode`` (building the body) and
        ``roundTrip`` (sending it until the reply is read), in ms."""
        if encoding not in {"npy", "json"}:
            raise ValueError(f"encoding must be 'npy' or 'json', not {encoding!r}")
        started = time.perf_counter()
        targets: dict[str, Any] = {"appID": app_id}
        if latency is not None:
            targets["latency"] = latency
        if accuracy is not None:
            targets["accuracy"] = accuracy
        if model_name is not None:
            targets["modelName"] = model_name
        binary = encode_query_inputs(inputs) if encoding == "npy" else None
        params: dict[str, Any] | None = targets
        if binary is None:
            content = json.dumps({**targets, "inputs": _jsonable(inputs)}).encode()
            content_type, params = "application/json", None
        else:
            content, content_type = binary
        encoded = time.perf_counter()
        reply: dict[str, Any] = self._call(
            "POST",
            "/v1/online_query",
            content=content,
            params=params,
            headers={"Content-Type": content_type},
        )
        finished = time.perf_counter()
        reply["clientTimingsMs"] = {
            "encode": round((encoded - started) * 1000, 3),
            "roundTrip": round((finished - encoded) * 1000, 3),
        }
        return reply

    def offline_query(
        self,
        input_path: str,
        output_path: str,
        app_id: str,
        accuracy: float | None = None,
        model_name: str | None = None,
        idempotency_key: str | None = None,
        pipeline: str | None = None,
    ) -> dict[str, Any]:
        """INFaaS ``offline_query``: a batch job over every object under ``input_path``
        (``s3://bucket/prefix``), by a variant of one model or through the app's ``pipeline``
        (every input row takes its own path through the DAG); one result per input lands under
        ``output_path``. Returns the job at once (``wait_for_job`` follows it to the end).
        Carries ``idempotency_key`` (else a new UUID) and is retried with it when its reply is
        lost: one job, however many tries."""
        body: dict[str, Any] = {"appID": app_id, "inputPath": input_path, "outputPath": output_path}
        if accuracy is not None:
            body["accuracy"] = accuracy
        if model_name is not None:
            body["modelName"] = model_name
        if pipeline is not None:
            body["pipeline"] = pipeline
        reply: dict[str, Any] = self._call_once("POST", "/v1/offline_query", idempotency_key, json=body)
        return reply

    def feedback(
        self,
        query_id: str,
        app_id: str,
        label: int | Sequence[int] | None = None,
        reward: float | None = None,
    ) -> dict[str, Any]:
        """The truth about an answered query (its reply's ``queryId``): its class (one for every
        row, or one per row), or a reward in [0, 1]. The same feedback again changes nothing
        (``duplicate`` in the reply); different feedback for the same query is a 409."""
        body: dict[str, Any] = {"appID": app_id, "queryId": query_id}
        if label is not None:
            body["label"] = label if isinstance(label, int) else [int(c) for c in label]
        if reward is not None:
            body["reward"] = reward
        reply: dict[str, Any] = self._call("POST", "/v1/feedback", json=body)
        return reply

    def feedback_stats(self, app_id: str) -> dict[str, Any]:
        """Per model of the app: its feedback count, live accuracy and bandit weights."""
        reply: dict[str, Any] = self._call("GET", "/v1/feedback/stats", params={"appID": app_id})
        return reply

    def selection(self, app_id: str, admin: bool = False) -> str:
        """The app's selection policy: infaas, exp3 or exp4."""
        return str(self._call("GET", f"/v1/apps/{app_id}/selection", admin=admin)["policy"])

    def set_selection(self, app_id: str, policy: str, admin: bool = False) -> str:
        """Answer the app's queries that name no model by ``policy`` (infaas, exp3 or exp4)."""
        reply = self._call("PUT", f"/v1/apps/{app_id}/selection", admin=admin, json={"policy": policy})
        return str(reply["policy"])

    # --- pipelines (docs/PIPELINES.md) -----------------------------------------------------------
    def register_pipeline(self, spec: dict[str, Any], app_id: str) -> dict[str, Any]:
        """Register a pipeline (``spec``: name, stages, edges, latencySlo, accuracy) in the app."""
        reply: dict[str, Any] = self._call("POST", "/v1/pipelines", json={**spec, "appID": app_id})
        return reply

    def pipelines(self, app_id: str) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/pipelines", params={"appID": app_id})["pipelines"])

    def pipeline(self, name: str, app_id: str) -> dict[str, Any]:
        reply: dict[str, Any] = self._call("GET", f"/v1/pipelines/{name}", params={"appID": app_id})
        return reply

    def delete_pipeline(self, name: str, app_id: str) -> None:
        self._call("DELETE", f"/v1/pipelines/{name}", params={"appID": app_id})

    def pipeline_plan(
        self, name: str, app_id: str, qps: float, lambda_allowed: bool = False
    ) -> dict[str, Any]:
        """The planner's per-stage variant, batch size and instances for ``qps`` arrivals, and why."""
        params = {"appID": app_id, "qps": qps, "lambdaAllowed": lambda_allowed}
        reply: dict[str, Any] = self._call("GET", f"/v1/pipelines/{name}/plan", params=params)
        return reply

    def query_pipeline(self, name: str, inputs: Any, app_id: str) -> dict[str, Any]:
        """One online query through the pipeline: the answer, each stage's variant, tier and
        timings, and the end-to-end time against the SLO."""
        body = {"appID": app_id, "inputs": _jsonable(inputs)}
        reply: dict[str, Any] = self._call("POST", f"/v1/pipelines/{name}/query", json=body)
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

    def workers(self, admin: bool = False) -> list[dict[str, Any]]:
        """Live worker state: with the app's key, the workers running its own instances (those
        only, without addresses); with the admin key (``admin=True``), every worker as it reports."""
        return list(self._call("GET", "/v1/workers", admin=admin)["workers"])

    def cache_stats(self) -> dict[str, Any]:
        """The prediction cache (admin key): hits, misses, hitRate, entries, bytesUsed, maxBytes,
        evictions (docs/QUERIES.md, "The prediction cache")."""
        return dict(self._call("GET", "/v1/cache", admin=True))

    def clear_cache(self) -> None:
        """Empty the prediction cache and reset its counters (admin key)."""
        self._call("DELETE", "/v1/cache", admin=True)


def _worth_retrying(error: ModellessClientError) -> bool:
    """A reply that says the call did not happen yet, or may not have: a gateway or server that
    could not answer now, or the first attempt of this very call still running."""
    in_progress = error.code == "idempotency_conflict" and error.details.get("reason") == "in_progress"
    return error.status in RETRIED_STATUSES or in_progress


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JPEG_MAGIC = b"\xff\xd8\xff"


def encode_query_inputs(inputs: Any) -> tuple[bytes, str] | None:
    """A query's inputs as a binary body and its content type: an array as ``.npy``, a mapping of
    arrays as ``.npz``, image bytes as ``image/png`` or ``image/jpeg`` (other bytes as
    ``application/octet-stream``, which the server recognises by their first bytes). None for
    what has no binary form (a list that is not a regular numeric array): it goes as JSON, and
    the server says what is wrong with it."""
    if isinstance(inputs, bytes | bytearray | memoryview):
        data = bytes(inputs)
        if data.startswith(PNG_MAGIC):
            return data, "image/png"
        if data.startswith(JPEG_MAGIC):
            return data, "image/jpeg"
        return data, "application/octet-stream"
    buffer = io.BytesIO()
    if isinstance(inputs, Mapping):
        arrays: dict[str, Any] = {}
        for name, value in inputs.items():
            array = _numeric_array(value)
            if array is None:
                return None
            arrays[str(name)] = array
        np.savez(buffer, allow_pickle=False, **arrays)
        return buffer.getvalue(), "application/x-npz"
    array = _numeric_array(inputs)
    if array is None:
        return None
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue(), "application/x-npy"


def _numeric_array(value: Any) -> np.ndarray | None:
    """``value`` as an array if it is a regular numeric one (an array as it is; lists as numpy
    reads them: floats as float64, integers as int64)."""
    try:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        return None
    if array.dtype.names is not None:  # a structured batch: one field per input
        return array
    return array if array.dtype.kind in "biuf" else None


def _jsonable(inputs: Any) -> Any:
    if isinstance(inputs, np.ndarray):
        return inputs.tolist()
    if isinstance(inputs, Mapping):
        return {str(name): _jsonable(value) for name, value in inputs.items()}
    return inputs


def _is_module(model: object) -> bool:
    """A torch module (torch itself is imported only if one is given)."""
    return not isinstance(model, (str, bytes, Path)) and hasattr(model, "forward") and hasattr(model, "eval")


def export_torch_module(module: Any, valset: Path | bytes, target: Path) -> Path:
    """A ``torch.nn.Module`` (or TorchScript module) as one self-contained ONNX file at ``target``,
    with a dynamic batch dimension on every input, traced on examples from the validation set:
    every input array it holds (``inputs`` for a one-input module, else one array per input,
    given to ``forward`` by name where its parameters have those names, else in the archive's
    order). torch is needed only on this path.

    Exported in eval mode but not under ``torch.no_grad()``: without gradients some modules
    (``nn.TransformerEncoder``) take a fused fast path that no exporter can translate."""
    import torch

    names, arrays = _example_arrays(valset)
    names, arrays = _forward_order(module, names, arrays)
    examples = tuple(torch.from_numpy(array) for array in arrays)
    was_training = bool(getattr(module, "training", False))
    module.eval()
    try:
        try:
            if isinstance(module, torch.jit.ScriptModule):
                raise TypeError("TorchScript modules go through the TorchScript exporter")
            batch = torch.export.Dim("batch")
            torch.onnx.export(
                module,
                examples,
                str(target),
                input_names=names,
                output_names=["logits"],
                dynamic_shapes=tuple({0: batch} for _ in names),
                external_data=False,  # one file: the weights inside it, not in target.data
                dynamo=True,
            )
        except Exception as dynamo_error:  # the torch.export path cannot take every module
            axes = {name: {0: "batch"} for name in [*names, "logits"]}
            try:
                torch.onnx.export(
                    module,
                    examples,
                    str(target),
                    input_names=names,
                    output_names=["logits"],
                    dynamic_axes=axes,
                    opset_version=17,
                    dynamo=False,
                )
            except Exception as error:
                raise ValueError(
                    f"the module could not be exported to ONNX: torch.export: {dynamo_error}; "
                    f"TorchScript: {error}"
                ) from error
    finally:
        module.train(was_training)
    return target


def _example_arrays(valset: Path | bytes) -> tuple[list[str], list[np.ndarray]]:
    """The validation set's input arrays (two rows each: a batch of one lets torch.export
    specialise the batch dimension to 1), floats as float32 unless float16."""
    source = valset if isinstance(valset, Path) else io.BytesIO(valset)
    with np.load(source, allow_pickle=False) as data:
        members = [name for name in data.files if name != "labels"]
        if not members:
            raise ValueError("the validation set holds no input arrays besides 'labels'")
        names: list[str] = []
        arrays: list[np.ndarray] = []
        for member in members:
            array = np.asarray(data[member][:2])
            if len(array) == 1:
                array = np.concatenate([array, array])
            if array.dtype.kind == "f" and array.dtype != np.float16:
                array = array.astype(np.float32)
            names.append("input" if member == "inputs" else member)
            arrays.append(np.ascontiguousarray(array))
    return names, arrays


def _forward_order(
    module: Any, names: list[str], arrays: list[np.ndarray]
) -> tuple[list[str], list[np.ndarray]]:
    """The arrays in ``forward``'s parameter order where every one is named after a parameter."""
    try:
        parameters = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return names, arrays
    if len(names) < 2 or not set(names) <= set(parameters):
        return names, arrays
    order = sorted(range(len(names)), key=lambda i: parameters.index(names[i]))
    return [names[i] for i in order], [arrays[i] for i in order]
