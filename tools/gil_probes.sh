#!/bin/sh
# Add (or, with --remove, delete) the perf uprobes that `python -m threadloader bench --proxy`
# reads to count GIL hand-offs per image: tlgil:take (take_gil entered), tlgil:drop (drop_gil
# entered) and tlgil:wait (take_gil about to wait on the GIL's condition: another thread holds it).
# Needs perf, root (or a permissive perf_event_paranoid and tracefs), and a CPython with the GIL
# whose take_gil/drop_gil are in its symbol table (pyenv and python.org builds have them).
# Usage: tools/gil_probes.sh [--remove] [PYTHON]   (PYTHON: default python3 on PATH)
set -eu
remove=0
if [ "${1:-}" = "--remove" ]; then remove=1; shift; fi
py=${1:-python3}
# The file holding the interpreter's code: libpython when it is shared, else the executable.
lib=$("$py" -c 'import sys, sysconfig, os
d, n = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
p = os.path.join(d or "", n or "")
print(p if sysconfig.get_config_var("Py_ENABLE_SHARED") and os.path.exists(p) else os.path.realpath(sys.executable))')
if [ "$remove" = 1 ]; then
    perf probe -q -d 'tlgil:*' || true
    exit 0
fi
start=$(nm "$lib" | awk '$3 == "take_gil" {print $1; exit}')
[ -n "$start" ] || { echo "no take_gil symbol in $lib" >&2; exit 1; }
end=$(printf '%x' $((0x$start + 4096)))
# The call of pthread_cond_timedwait inside take_gil: reached only when the GIL is held by another thread.
call=$(objdump -d --start-address=0x$start --stop-address=0x$end "$lib" \
       | awk '/call.*pthread_cond_timedwait/ {sub(":", "", $1); print $1; exit}')
[ -n "$call" ] || { echo "no pthread_cond_timedwait call found in take_gil of $lib" >&2; exit 1; }
offset=$(printf '0x%x' $((0x$call - 0x$start)))
perf probe -q -d 'tlgil:*' 2>/dev/null || true
perf probe -q -x "$lib" --add "tlgil:take=take_gil"
perf probe -q -x "$lib" --add "tlgil:drop=drop_gil"
perf probe -q -x "$lib" --add "tlgil:wait=take_gil+$offset"
echo "perf probes tlgil:take, tlgil:drop, tlgil:wait (take_gil+$offset) on $lib"
