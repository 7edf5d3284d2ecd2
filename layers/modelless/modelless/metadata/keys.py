"""Every Redis key name the project uses, in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KeySpace:
    prefix: str = "modelless:"

    def app(self, app_id: str) -> str:
        return f"{self.prefix}app:{app_id}"

    def api_key(self, key_hash: str) -> str:
        return f"{self.prefix}apikey:{key_hash}"

    def model(self, app_id: str, model_name: str) -> str:
        return f"{self.prefix}model:{app_id}:{model_name}"

    def models(self, app_id: str) -> str:
        return f"{self.prefix}models:{app_id}"

    def registration(self, registration_id: str) -> str:
        return f"{self.prefix}registration:{registration_id}"

    def variants(self, app_id: str) -> str:
        """Hash: variant id -> profile JSON, for every variant of the app."""
        return f"{self.prefix}variants:{app_id}"

    def accuracy_index(self, app_id: str, model_name: str | None = None) -> str:
        """Sorted set: variant id scored by accuracy, per app and per model."""
        suffix = f":{model_name}" if model_name else ""
        return f"{self.prefix}idx:accuracy:{app_id}{suffix}"

    def latency_index(self, app_id: str) -> str:
        """Sorted set: variant id scored by batch-1 p99 latency."""
        return f"{self.prefix}idx:latency:{app_id}"

    def profiles_version(self, app_id: str) -> str:
        """Counter bumped with every change to the app's profiles (gateway cache revalidation)."""
        return f"{self.prefix}profiles-version:{app_id}"

    def load(self, second: int) -> str:
        """Hash: group key -> queries counted in that epoch second (expires on its own)."""
        return f"{self.prefix}load:{second}"

    def workers(self) -> str:
        """Hash: worker id -> its last state report (JSON)."""
        return f"{self.prefix}workers"

    def pattern(self) -> str:
        return f"{self.prefix}*"
