#!/bin/bash
# Scale-in drain of a modelless pool worker (the modelless-lifecycle service; infra/aws/worker-boot.sh
# installs it). Polls the instance's Auto Scaling target lifecycle state in the instance metadata;
# when it turns Terminated (the scaler chose this instance to leave, or the group replaces it), the
# instance is held in Terminating:Wait by the group's lifecycle hook (template.yaml: modelless-drain)
# while this script
#   1. stops the worker service: SIGTERM, on which the worker stops reporting, finishes the
#      requests in flight and exits (modelless.worker.server);
#   2. removes the worker's last report from the metadata store, so that no gateway picks it in
#      the seconds before the report would go stale;
#   3. completes the lifecycle action, and the termination goes on.
# If any step fails, the hook's timeout (DefaultResult CONTINUE) lets the termination go on anyway.
set -uo pipefail

ENV_FILE="${MODELLESS_ENV_FILE:-/etc/modelless-worker.env}"
INSTANCE_ENV_FILE="${MODELLESS_INSTANCE_ENV_FILE:-/etc/modelless-worker-instance.env}"
set -a  # the settings are the environment of what runs next (aws, python)
# shellcheck source=/dev/null
source "$ENV_FILE"
# shellcheck source=/dev/null
source "$INSTANCE_ENV_FILE"
set +a
IMDS="${MODELLESS_IMDS_URL:-http://169.254.169.254}"
PYTHON="${MODELLESS_PYTHON:-/opt/modelless/venv/bin/python}"
POLL_S="${MODELLESS_LIFECYCLE_POLL_S:-5}"

log() { echo "modelless-lifecycle: $*" >&2; }

target_state() {
  local token
  token="$(curl -sf -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300")" \
    || return 1
  curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/autoscaling/target-lifecycle-state"
}

until [ "$(target_state)" = "Terminated" ]; do
  sleep "$POLL_S"
done
log "instance $MODELLESS_WORKER_ID is leaving group $MODELLESS_GROUP: draining its worker"

systemctl stop modelless-worker.service || log "stopping the worker failed; going on"

"$PYTHON" - "$MODELLESS_WORKER_ID" <<'PYEOF' || log "removing the worker's report failed; it goes stale by itself"
import os
import sys

from modelless.metadata import open_metadata_store

open_metadata_store(os.environ["MODELLESS_METADATA_URL"]).remove_worker(sys.argv[1])
PYEOF

aws autoscaling complete-lifecycle-action \
  --lifecycle-hook-name "$MODELLESS_LIFECYCLE_HOOK" \
  --auto-scaling-group-name "$MODELLESS_GROUP" \
  --instance-id "$MODELLESS_WORKER_ID" \
  --lifecycle-action-result CONTINUE
log "lifecycle action completed"
