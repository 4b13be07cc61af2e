#!/usr/bin/env bash
# twin's bash completion (cli/completion_command.cpp) as bash runs it: the script CMake wrote beside the built twin
# sources with no error, registers itself for `twin`, completes commands, flags and scenarios, and is what
# `twin completion bash` prints now (so the built file never falls out of date). Arguments: the twin binary, its
# twin.bash. Exit 0 when every check holds; each failure prints a line.
set -u
twin=$1 script=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

diff -q <("$twin" completion bash) "$script" >/dev/null || fail "$script differs from 'twin completion bash'"
errors=$(bash -c "source '$script'" 2>&1) && [[ -z $errors ]] || fail "sourcing $script: $errors"

# The words bash would complete at the last position of "$@", as one space-separated line.
complete_words() {
  bash -c 'source "$0"; COMP_WORDS=("${@}"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _twin; echo "${COMPREPLY[*]}"' \
    "$script" "$@"
}
expect() {
  local want=$1; shift
  local got; got=$(complete_words "$@")
  [[ $got == "$want" ]] || fail "completing '$*': got '$got', want '$want'"
}
expect_within() {
  local word=$1; shift
  local got; got=$(complete_words "$@")
  [[ " $got " == *" $word "* ]] || fail "completing '$*': '$word' not in '$got'"
}

registered=$(bash -c "source '$script'; complete -p twin" 2>&1)
[[ $registered == *"-F _twin"*" twin" ]] || fail "complete -p twin: '$registered'"
expect sim twin si
# --gr is also the start of Megatron's --group-query-attention, which twin sim takes too.
expect_within --granularity twin sim --gr
expect --granularity twin sim --gran
expect "--days" twin sweep --day
expect "--days" twin search --days
expect bash twin completion b
expect_within gpt3-175b twin sim gpt3
expect_within llama3-405b-meta twin sweep llama3-405b-m  # a published scenario's name
expect "" twin nosuchcommand --gr
"$twin" completion zsh >/dev/null 2>&1 && fail "'twin completion zsh' was accepted"
refused=$("$twin" completion zsh 2>&1)
[[ $refused == "twin: error: "*"zsh"* ]] || fail "'twin completion zsh' said: $refused"

[[ $failures == 0 ]] && echo "bash completion: every check holds"
exit $((failures > 0))
