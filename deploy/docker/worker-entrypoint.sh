#!/bin/sh
# Entrypoint of the worker image: runs `ztrain ARGS...`. When ZT_RUN_DIR names a run directory that already
# holds a checkpoint (its `latest` file) and ARGS has no --resume, it adds `--resume $ZT_RUN_DIR`, so that a
# re-created Kubernetes Job continues from the last checkpoint instead of starting over.
set -eu
if [ -n "${ZT_RUN_DIR:-}" ] && [ -f "$ZT_RUN_DIR/latest" ]; then
  resume=yes
  for arg in "$@"; do
    case "$arg" in
      --resume | --resume=*) resume=no ;;
    esac
  done
  if [ "$resume" = yes ]; then
    echo "ztrain-entrypoint: resuming from $ZT_RUN_DIR ($(cat "$ZT_RUN_DIR/latest"))" >&2
    set -- "$@" --resume "$ZT_RUN_DIR"
  fi
fi
exec ztrain "$@"
