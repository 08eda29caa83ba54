#!/usr/bin/env sh
# The same app in plain shell: curl and sed, nothing else. Plays N sessions of one sum each and
# posts 1 when the model's last number is the answer, else 0.
#
#   AREAL_AGENTS_ADMIN_KEY=... sh examples/online_client/client.sh http://127.0.0.1:8400 [N]
set -eu
URL="${1:-http://127.0.0.1:8400}"
N="${2:-8}"
: "${AREAL_AGENTS_ADMIN_KEY:?set AREAL_AGENTS_ADMIN_KEY to the run's admin key}"
field() { sed -n "s/.*\"$1\": *\"\([^\"]*\)\".*/\1/p"; }   # a string field of a one-line JSON reply

i=0; right=0
while [ "$i" -lt "$N" ]; do
  a=$((10 + i * 7 % 90)); b=$((10 + i * 13 % 90)); answer=$((a + b))
  session=$(curl -sf -X POST "$URL/rl/sessions" -H "Authorization: Bearer $AREAL_AGENTS_ADMIN_KEY" \
            -H "Content-Type: application/json" -d "{\"group\": \"sh-$a+$b\"}")
  key=$(printf '%s' "$session" | field key)
  reply=$(curl -sf "$URL/v1/chat/completions" -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
          -d "{\"model\": \"policy\", \"messages\": [{\"role\": \"user\", \"content\": \"$a+$b=\"}]}")
  content=$(printf '%s' "$reply" | field content)
  last=$(printf '%s' "$content" | grep -o -- '-\{0,1\}[0-9]\{1,\}' | tail -n 1 || true)
  reward=0; [ "$last" = "$answer" ] && reward=1 && right=$((right + 1))
  curl -sf -X POST "$URL/rl/sessions/$key/reward" -H "Content-Type: application/json" -d "{\"reward\": $reward}" >/dev/null
  printf '%s+%s= -> %s (reward %s)\n' "$a" "$b" "$content" "$reward"
  i=$((i + 1))
done
echo "$right of $N right"
