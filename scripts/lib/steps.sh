# Timed steps for .ci/run and scripts/test (sourced): `step NAME COMMAND...` runs COMMAND, prints
# "$STEP_PREFIX: NAME took Ns" to standard error as it ends and returns its status; `step_summary`
# prints every step's line again (CI's log keeps only its tail).
step_lines=()
step() {
  local name=$1 t=$SECONDS status=0
  shift
  "$@" || status=$?
  step_lines+=("$(printf '%-44s %5ds%s' "$name" $((SECONDS - t)) "$([[ $status == 0 ]] || echo "  (exit $status)")")")
  echo "${STEP_PREFIX:-step}: $name took $((SECONDS - t))s" >&2
  return $status
}
step_summary() { printf '%s\n' "${step_lines[@]}" >&2; }
