#!/bin/bash
# Boot script of a modelless pool worker (an EC2 instance of a pool's Auto Scaling group).
#
# The launch template's user data writes the pool's settings to /etc/modelless-worker.env
# (MODELLESS_POOL, MODELLESS_SLOTS, MODELLESS_WORKER_TUNING, MODELLESS_DEPLOY_URL,
# MODELLESS_REPOSITORY_URL, MODELLESS_METADATA_URL, MODELLESS_LIFECYCLE_HOOK, AWS_DEFAULT_REGION), downloads this script
# from $MODELLESS_DEPLOY_URL/worker-boot.sh (published by scripts/publish-worker) and runs it as
# root. It
#   1. reads the instance's identity from the instance metadata service (IMDSv2): its id is the
#      worker's id (the scaler maps scale-in choices to instances by it), its private IP the
#      address the worker advertises in the metadata store (gateway, scaler and offline jobs reach
#      it there, across the VPC);
#   2. installs the library into /opt/modelless/venv from the wheel published beside this script,
#      with its `worker` extra, at the versions of the constraints.txt published with it (the same
#      pins as the development environment and the Lambda packages); the gpu pool swaps
#      onnxruntime for onnxruntime-gpu where an NVIDIA driver is present;
#   3. starts two systemd services: modelless-worker (modelless.worker.server on port 8500; a stop
#      sends SIGTERM, and the worker stops reporting, finishes what is in flight, then exits) and
#      modelless-lifecycle (infra/aws/worker-lifecycle.sh: on scale-in, drains the worker and then
#      completes the group's termination lifecycle action).
set -euo pipefail

ENV_FILE=/etc/modelless-worker.env
INSTANCE_ENV_FILE=/etc/modelless-worker-instance.env
HOME_DIR=/opt/modelless
VENV="$HOME_DIR/venv"
IMDS="${MODELLESS_IMDS_URL:-http://169.254.169.254}"
WORKER_PORT=8500

log() { echo "modelless-worker-boot: $*" >&2; }

set -a  # the settings are the environment of what runs next (aws, pip)
# shellcheck source=/dev/null
source "$ENV_FILE"
set +a
: "${MODELLESS_POOL:?}" "${MODELLESS_SLOTS:?}" "${MODELLESS_DEPLOY_URL:?}" \
  "${MODELLESS_REPOSITORY_URL:?}" "${MODELLESS_METADATA_URL:?}" "${MODELLESS_LIFECYCLE_HOOK:?}" \
  "${MODELLESS_WORKER_TUNING:?}"

imds() { # path: one instance metadata value, through an IMDSv2 session token
  local token
  token="$(curl -sf -X PUT "$IMDS/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300")"
  curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/latest/meta-data/$1"
}

INSTANCE_ID="$(imds instance-id)"
PRIVATE_IP="$(imds local-ipv4)"
group_of_instance() {
  aws autoscaling describe-auto-scaling-instances --instance-ids "$INSTANCE_ID" \
    --query 'AutoScalingInstances[0].AutoScalingGroupName' --output text
}
GROUP=""
for _ in $(seq 30); do  # the group lists its instance from launch; retry a transient failure
  GROUP="$(group_of_instance || true)"
  [ -n "$GROUP" ] && [ "$GROUP" != "None" ] && break
  sleep 10
done
[ -n "$GROUP" ] && [ "$GROUP" != "None" ] || { log "instance $INSTANCE_ID is in no Auto Scaling group"; exit 1; }
log "instance $INSTANCE_ID ($PRIVATE_IP) of group $GROUP, pool $MODELLESS_POOL"
cat > "$INSTANCE_ENV_FILE" <<INSTANCE
MODELLESS_WORKER_ID=$INSTANCE_ID
MODELLESS_ADVERTISE_HOST=$PRIVATE_IP
MODELLESS_WORKER_PORT=$WORKER_PORT
MODELLESS_GROUP=$GROUP
INSTANCE

# --- Python and the project ---------------------------------------------------------------------
find_python() {
  local candidate
  for candidate in python3.12 python3.11; do
    if command -v "$candidate" >/dev/null 2>&1; then command -v "$candidate"; return; fi
  done
  return 1
}
if ! PYTHON="$(find_python)"; then
  log "installing Python"
  if command -v dnf >/dev/null 2>&1; then
    dnf install -y -q python3.12 python3.12-pip || dnf install -y -q python3.11 python3.11-pip
  else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq python3-venv python3-pip
  fi
  PYTHON="$(find_python || command -v python3)"
fi

id modelless >/dev/null 2>&1 || useradd --system --home-dir "$HOME_DIR" --shell /sbin/nologin modelless
mkdir -p "$HOME_DIR/deploy"
aws s3 cp --recursive --only-show-errors "$MODELLESS_DEPLOY_URL/" "$HOME_DIR/deploy/"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
wheels=("$HOME_DIR"/deploy/wheels/*.whl)
[ -e "${wheels[0]}" ] || { log "no wheel under $MODELLESS_DEPLOY_URL/wheels/ (run scripts/publish-worker)"; exit 1; }
CONSTRAINTS="$HOME_DIR/deploy/constraints.txt"
[ -f "$CONSTRAINTS" ] || { log "no constraints.txt under $MODELLESS_DEPLOY_URL/ (run scripts/publish-worker)"; exit 1; }
# Each wheel with its worker extra: what python -m modelless.worker imports, pinned.
"$VENV/bin/pip" install --quiet --constraint "$CONSTRAINTS" "${wheels[@]/%/[worker]}"
if [ "$MODELLESS_POOL" = "gpu" ] && command -v nvidia-smi >/dev/null 2>&1; then
  # Same version, CUDA build: modelless.serving.runtime prefers the CUDA provider where it is available.
  ort_version="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("onnxruntime"))')"
  "$VENV/bin/pip" uninstall --quiet --yes onnxruntime
  "$VENV/bin/pip" install --quiet --constraint "$CONSTRAINTS" "onnxruntime-gpu==$ort_version" \
    || "$VENV/bin/pip" install --quiet --constraint "$CONSTRAINTS" "onnxruntime==$ort_version"
fi
install -m 0755 "$HOME_DIR/deploy/worker-lifecycle.sh" "$HOME_DIR/worker-lifecycle"

# --- services -----------------------------------------------------------------------------------
install -m 0644 "$HOME_DIR/deploy/systemd/modelless-worker.service" /etc/systemd/system/
install -m 0644 "$HOME_DIR/deploy/systemd/modelless-lifecycle.service" /etc/systemd/system/
systemctl daemon-reload
systemctl enable --now modelless-worker.service modelless-lifecycle.service
log "worker started: http://$PRIVATE_IP:$WORKER_PORT"
