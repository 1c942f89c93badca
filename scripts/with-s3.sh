#!/usr/bin/env bash
# with-s3.sh COMMAND...: runs COMMAND beside a local S3-compatible server.
#
# Starts versitygw (posix backend on a temporary directory, listening on
# 127.0.0.1 on a free port) with one bucket, exports what the S3 tests read, runs COMMAND, then stops the
# server and removes its directory. Exits with COMMAND's status, or 1 when
# the server cannot start.
#
# Exported to COMMAND:
#   AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
#       the server and its root credentials
#   KVBM_S3_BUCKET   a bucket that exists (Go tests make their own)
#   KVBM_VERSITYGW   the server binary, for tests that stop and restart
#                    servers of their own
#
# VERSITYGW names the binary (installed by the Makefile's versitygw target).
set -euo pipefail

gw=${VERSITYGW:?VERSITYGW must name the versitygw binary}
[ -x "$gw" ] || { echo "with-s3.sh: $gw is not an executable" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/kvbm-s3.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
	rm -rf "$root"
}
trap cleanup EXIT

# A free port: bind port 0, read what the kernel chose, release it. Another
# process could take it in between; the readiness check below then fails.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

access=kvbmtest
secret=kvbmtest-secret-$RANDOM$RANDOM
# The posix backend serves each top-level directory as a bucket.
mkdir -p "$root/data/kvbm"
ROOT_ACCESS_KEY=$access ROOT_SECRET_KEY=$secret \
	"$gw" --port "127.0.0.1:$port" posix "$root/data" >"$root/server.log" 2>&1 &
pid=$!

# Ready when it accepts a connection; versitygw takes well under a second.
for _ in $(seq 1 100); do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		ready=1
		break
	fi
	kill -0 "$pid" 2>/dev/null || break
	sleep 0.05
done
if [ -z "${ready:-}" ]; then
	echo "with-s3.sh: versitygw did not start on 127.0.0.1:$port:" >&2
	cat "$root/server.log" >&2
	exit 1
fi

export AWS_ENDPOINT_URL_S3="http://127.0.0.1:$port"
export AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret AWS_REGION=us-east-1
export KVBM_S3_BUCKET=kvbm KVBM_VERSITYGW=$gw
set +e
"$@"
rc=$?
set -e
exit $rc
