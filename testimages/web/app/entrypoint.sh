#!/bin/sh
# Entrypoint of the monky e2e web image: writes the page, /variant.txt and /env.txt (the env
# vars this container got whose names start with one of $WEB_ENV_PREFIXES), then serves /www
# with busybox httpd on :8080 until SIGTERM. WEB_VARIANT / WEB_HEALTHY in the container's
# environment override the values baked into /etc/monky-web/.
set -eu

WEB_VARIANT="${WEB_VARIANT:-$(cat /etc/monky-web/variant)}"
WEB_HEALTHY="${WEB_HEALTHY:-$(cat /etc/monky-web/healthy)}"

sed "s/@VARIANT@/${WEB_VARIANT}/g" /app/www/index.html > /www/index.html
echo "${WEB_VARIANT}" > /www/variant.txt

pattern=""
for prefix in ${WEB_ENV_PREFIXES}; do
    pattern="${pattern:+${pattern}|}^${prefix}"
done
if [ -n "${pattern}" ]; then
    env | grep -E "${pattern}" | sort > /www/env.txt || true
else
    : > /www/env.txt
fi

if [ "${WEB_HEALTHY}" = "1" ]; then
    echo ok > /www/healthz
else
    rm -f /www/healthz
    echo "monky-e2e-web: healthz disabled (WEB_HEALTHY=${WEB_HEALTHY}), healthcheck will fail"
fi

echo "monky-e2e-web: variant ${WEB_VARIANT} serving on :8080 ($(wc -l < /www/env.txt) env vars listed)"
busybox httpd -f -p 8080 -h /www &
httpd_pid=$!
trap 'kill -TERM "${httpd_pid}" 2>/dev/null || true; wait "${httpd_pid}" || true; echo "monky-e2e-web: stopped"; exit 0' TERM INT
wait "${httpd_pid}"
