#!/usr/bin/env bash
# The kill -9 story, twice in a row, each time with a fresh KISO_HOME:
#   a session edits f1.txt, runs a slow shell command that would create marker.txt 3 s later,
#   then edits f3.txt. While the shell runs, kiso's own process group is killed with SIGKILL,
#   `kill -9 -PGID`, as a machine crash would; nothing else is killed by hand. The shell's
#   supervisor sees kiso die and kills the command: after waiting past the sleep, marker.txt is
#   still not there. `kiso resume` then rules the interrupted command "skip" and the ORIGINAL
#   trajectory continues: f3.txt is edited, nothing before it repeats, and marker.txt never
#   appears.
# Its temporary folders (two per round, under $TMPDIR) are removed when it ends, however it ends;
# `--keep` keeps them and prints where they are.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=no
case "${1:-}" in
    --keep) keep=yes ;;
    "") ;;
    *) echo "usage: scripts/demo-kill9.sh [--keep]" >&2; exit 2 ;;
esac
scripts/bootstrap >/dev/null
kiso="$PWD/.venv/bin/kiso"
made=()
cleanup() {
    [ ${#made[@]} -gt 0 ] || return 0
    if [ "$keep" = yes ]; then
        echo "kept the temporary folders: ${made[*]}"
    else
        rm -rf -- "${made[@]}"
        echo "removed the temporary folders (${#made[@]}); --keep keeps them"
    fi
}
trap cleanup EXIT

story() {
    local home ws log pid pgid shell marker running
    home=$(mktemp -d) ws=$(mktemp -d)
    made+=("$home" "$ws")
    printf 'OLD\n' > "$ws/f1.txt"
    printf 'OLD\n' > "$ws/f3.txt"
    cat > "$home/script.json" <<'JSON'
{"turns": [
  {"text": "First file.", "tool_calls": [{"name": "edit_file", "input": {"path": "f1.txt", "edits": [{"oldText": "OLD", "newText": "NEW"}]}}]},
  {"text": "Now the slow suite.", "tool_calls": [{"name": "shell", "input": {"command": "echo $$ > shell.pid; sleep 3 && touch marker.txt"}}]},
  {"text": "Last file.", "tool_calls": [{"name": "edit_file", "input": {"path": "f3.txt", "edits": [{"oldText": "OLD", "newText": "NEW"}]}}]},
  {"text": "All done."}
]}
JSON
    export KISO_HOME="$home" KISO_FAUX_SCRIPT="$home/script.json"
    echo "== round $1: KISO_HOME=$home, workspace $ws"
    (cd "$ws" && exec setsid "$kiso" -p "edit, run the suite, edit" k9 --mode bypass) \
        >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        log=$(ls "$home"/projects/*/k9.jsonl 2>/dev/null || true)
        if [ -n "$log" ] && [ "$(grep -c '"type":"execution_started"' "$log" || true)" -ge 2 ] \
            && [ -s "$ws/shell.pid" ]; then
            break
        fi
        sleep 0.05
    done
    shell=$(cat "$ws/shell.pid")
    pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')  # kiso's own group (setsid: the pid we recorded)
    echo "   the command runs (shell pid $shell); kill -9 -$pgid: kiso's group, nothing else"
    kill -9 -- "-$pgid"
    wait "$pid" 2>/dev/null || true
    sleep 4.5  # past the 3 s the command sleeps before it would touch marker.txt
    marker=$([ -e "$ws/marker.txt" ] && echo yes || echo no)
    running=$(kill -0 "$shell" 2>/dev/null && echo running || echo gone)
    echo "   after the crash and the sleep: f1=$(cat "$ws/f1.txt") f3=$(cat "$ws/f3.txt")" \
        "marker=$marker shell=$running"
    [ "$marker" = no ] && [ "$running" = gone ]
    echo "   kiso resume k9 --resolve skip"
    (cd "$ws" && "$kiso" resume k9 --resolve skip --mode bypass < /dev/null)
    echo "   after the resume: f1=$(cat "$ws/f1.txt") f3=$(cat "$ws/f3.txt") marker=$([ -e "$ws/marker.txt" ] && echo yes || echo no)"
    [ "$(cat "$ws/f1.txt")" = NEW ] && [ "$(cat "$ws/f3.txt")" = NEW ] && [ ! -e "$ws/marker.txt" ]
    [ "$(grep -c '"type":"execution_resolved"' "$log")" = 1 ]
}

story 1
story 2
echo "both rounds: the trajectory continued, nothing repeated, the marker never appeared"
