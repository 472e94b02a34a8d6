# The plane as a service (docs/service.md): `evidence serve` as an unprivileged user, its
# ledger, keys and sandboxes in the volume /var/lib/evidence.
#
#   docker build -t evidence-ledger .
#   docker run --rm -v evidence:/var/lib/evidence evidence-ledger evidence init --operator ops
#   docker run -d -v evidence:/var/lib/evidence -p 127.0.0.1:8750:8750 evidence-ledger

# -- build: the wheel, exactly as tests/test_packaging.py builds it --------------------------
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ledger ledger
COPY projections projections
COPY commands commands
COPY examples examples
COPY docs docs
RUN pip wheel --no-cache-dir --no-deps -w /dist .

# -- run: the wheel and its dependencies (with the PostgreSQL driver), nothing else -------
FROM python:3.11-slim
COPY --from=wheel /dist /dist
RUN pip install --no-cache-dir "$(echo /dist/evidence_ledger-*.whl)[postgres]" \
    && rm -rf /dist \
    && useradd --system --home-dir /var/lib/evidence --shell /usr/sbin/nologin evidence \
    && install -d -o evidence -g evidence -m 0700 /var/lib/evidence /var/lib/evidence/keys

# Where the ledger, the plane key, the operator key and the plans' sandboxes live: one
# volume, only the service's user reads it (keep the operator key elsewhere by setting
# EVIDENCE_OPERATOR_KEY when the operator works from another machine).
ENV EVIDENCE_DB=sqlite:////var/lib/evidence/evidence.db \
    EVIDENCE_PLANE_KEY=/var/lib/evidence/keys/plane.key \
    EVIDENCE_OPERATOR_KEY=/var/lib/evidence/keys/operator.key \
    EVIDENCE_STATE_DIR=/var/lib/evidence/state \
    PYTHONUNBUFFERED=1
VOLUME /var/lib/evidence
USER evidence
WORKDIR /var/lib/evidence
EXPOSE 8750
# 0.0.0.0 inside the container's own network namespace: refused until the ledger has an
# operator (`evidence init --operator NAME` first). Publish the port on loopback and put
# a TLS proxy in front. SIGTERM (docker stop) drains requests in flight.
STOPSIGNAL SIGTERM
CMD ["evidence", "serve", "--host", "0.0.0.0", "--port", "8750"]
