# Helpers the setup scripts share (sourced, not run): set `tag` (the prefix of their lines), `log` and `py` first.
quiet() {  # run a pip step, keep its output in the log, show the log's end if it fails
  if ! "$@" >>"$log" 2>&1; then
    echo "[$tag] failed: $*" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
have() {  # the package $1 is installed in $py's environment at version $2
  "$py" -m pip show -q "$1" >/dev/null 2>&1 && [ "$("$py" -m pip show "$1" | sed -n 's/^Version: //p')" = "$2" ]
}
