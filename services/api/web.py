"""What a browser gets from the API itself: the fleet page drawn on the server, Swagger UI, the favicon.

Nothing comes from a CDN: Swagger UI's assets are those of the `swagger-ui-bundle`
package (installed with the project), the favicon is drawn here, and the fleet
page's first paint is HTML rendered from the same queries the REST endpoints run,
so it reads without JavaScript (a plain screenshot, a text browser, a slow wall
screen); its script then refreshes it live and adds the detail, charts and
acknowledging.

The page needs a caller too: without one it is only its shell, with a form to log in
(paste a token, or pick the local mode's token file). `POST /login` checks the token
and keeps it in an HttpOnly, SameSite=Strict cookie, which reads may carry; the page's
writes send it in `Authorization` (services.api.guard takes no cookie for a write).
"""

from __future__ import annotations

import json
import struct
import zlib
from html import escape
from pathlib import Path
from typing import Any

import swagger_ui_bundle  # type: ignore[import-untyped]
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from shared.contract.models_health import ACTION_REASONS, LADDER

from .auth import COOKIE, AuthError, Identity
from .deps import State
from .guard import IDENTITY, client_address
from .headers import policy
from .parameters import AlertsQuery, GpuListQuery, LifecycleQuery
from .routes.alerts import alert_list
from .routes.fleet import summary_json
from .routes.gpus import gpu_list_json
from .routes.lifecycle import lifecycle_decisions
from .web_usage import usage_view

STATIC = Path(__file__).parent / "static"
MARK = {"healthy": "✓", "degraded": "!", "unhealthy": "✕", None: "?"}
WORD = {"healthy": "healthy", "degraded": "degraded", "unhealthy": "unhealthy", None: "not scored"}


def favicon() -> bytes:
    """A 16x16 ICO (PNG inside): a green square with a white cross-bar, drawn here."""
    size = 16
    rows = b""
    for y in range(size):
        row = b"\x00"  # filter: none
        for x in range(size):
            edge = x in (0, size - 1) or y in (0, size - 1)
            bar = 6 <= y <= 9 and 3 <= x <= 12
            row += bytes((255, 255, 255, 255) if bar else (29, 38, 48, 255) if edge else (46, 157, 87, 255))
        rows += row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return (
        struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", size, size, 0, 0, 1, 32, len(png), 22) + png
    )


def gpu_cell(g: dict[str, Any]) -> str:
    state = g.get("state")
    label = f"{g['hostname']} GPU {g['gpu_index']}: {WORD.get(state, state)}"
    if g.get("score") is not None:
        label += f", score {g['score']:g}"
    attrs = {
        "class": f"cell {state or 'unknown'}",
        "data-uuid": g["gpu_uuid"],
        "data-state": state or "unknown",
        "data-host": g["hostname"],
        "data-rack": g.get("rack") or "",
        "data-model": g.get("model") or "",
        "title": label,
        "aria-label": label,
        "role": "button",
        "tabindex": "0",
    }
    rendered = " ".join(f'{k}="{escape(str(v))}"' for k, v in attrs.items())
    return f"<span {rendered}><b>{MARK.get(state, '?')}</b><i>{g['gpu_index']}</i></span>"


def grid(gpus: list[dict[str, Any]]) -> str:
    tree: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for g in gpus:
        dc, rack = g.get("datacenter") or "(no datacenter)", g.get("rack") or "(no rack)"
        tree.setdefault(dc, {}).setdefault(rack, {}).setdefault(g["hostname"], []).append(g)
    out = []
    for dc, racks in tree.items():
        out.append(f'<div class="dc"><b>{escape(dc)}</b>')
        for rack, hosts in racks.items():
            out.append(f'<div class="rack"><div>{escape(rack)}</div>')
            for host, listed in hosts.items():
                cells = "".join(gpu_cell(g) for g in listed)
                out.append(
                    f'<div class="host" data-host="{escape(host)}"><small>{escape(host)}</small>{cells}</div>'
                )
            out.append("</div>")
        out.append("</div>")
    return "".join(out) or "no GPUs reported yet"


def where(alert: dict[str, Any]) -> str:
    """An alert's place: its GPU's host and index, or for a job's crash or a fault of a host or rack,
    the job or place and all the GPUs and hosts it touched (the GPU holding the alert is only the first)."""
    f = alert.get("shared")
    if not f:
        return f"{escape(alert['hostname'] or '?')} GPU {escape(str(alert['gpu_index']))}"
    return (
        f'<span class="shared" data-scope="{escape(f["scope"])}" title="{escape(" ".join(f["gpus"]))}">'
        f"{escape(f['scope'])} {escape(f['key'])}: {f['gpu_count']} GPUs"
        f" on {escape(', '.join(f['hosts']))}"
        "</span>"
    )


def alert_rows(alerts: list[dict[str, Any]]) -> str:
    if not alerts:
        return '<tr><td colspan="5">no open alerts</td></tr>'
    return "".join(
        f'<tr data-uuid="{escape(a["gpu_uuid"])}" data-alert="{a["id"]}">'
        f'<td class="{escape(a["severity"])}">{escape(a["severity"])}</td>'
        f"<td>{where(a)}</td>"
        f"<td>{escape(a['summary'])}</td><td>{escape(a['state'])}</td>"
        f'<td><time datetime="{escape(a["opened_at"])}">'
        f"{escape(a['opened_at'][:16].replace('T', ' '))} UTC</time></td></tr>"
        for a in alerts
    )


def lifecycle_said(body: dict[str, Any]) -> str:
    """The lifecycle panel's summary: one line per decision that acts, or why there is none."""
    if body["run"] is None:
        return "no lifecycle decisions yet"
    said = body["totals"]["said"] or ["every GPU: keep"]
    return "<br>".join(escape(line) for line in said)


def lifecycle_rows(body: dict[str, Any]) -> str:
    currency = body["run"]["currency"] if body["run"] else ""
    return "".join(
        f'<tr data-uuid="{escape(d["gpu_uuid"])}"><td>{escape(d["hostname"] or "?")}</td>'
        f"<td><b>{escape(d['decision'])}</b></td>"
        f"<td>{d['cost_of_waiting_per_day']:,.2f} {escape(currency)}</td><td>{escape(d['why'])}</td></tr>"
        for d in body["decisions"]
        if d["decision"] != "keep"
    )


def ladder_items() -> str:
    """The action ladder (shared.contract.models_health), an item per rung; the script reads `data-why`."""
    why = {a: escape(ACTION_REASONS[a]) for a in LADDER}
    return "".join(f'<li data-action="{a}" data-why="{why[a]}"><b>{a}</b>: {why[a]}</li>' for a in LADDER)


def who_line(identity: Identity) -> str:
    return f"{escape(identity.subject)} ({identity.role})"


async def render_page(state: State, template: str, identity: Identity | None) -> str:
    if identity is None:  # the shell: no fleet data without a caller
        return template.replace("<body>", '<body class="anonymous">', 1)
    template = template.replace('<span id="who"></span>', f'<span id="who">{who_line(identity)}</span>')
    # the same (cached) answers the API gives, as JSON
    summary = json.loads((await summary_json(state.db, state.cache, state.missing_after_s)).body)
    gpus: list[dict[str, Any]] = []
    while True:  # the whole fleet, in the API's pages
        query = GpuListQuery(sort="hostname", limit=1000, offset=len(gpus))
        listed = json.loads((await gpu_list_json(state.db, state.cache, query)).body)
        gpus += listed["gpus"]
        if not listed["gpus"] or len(gpus) >= listed["total"]:
            break
    alerts = (await alert_list(state.db, AlertsQuery(limit=50))).model_dump(mode="json")
    decided = (await lifecycle_decisions(state.db, LifecycleQuery(limit=10))).model_dump(mode="json")
    stats = {f"s-{k}": summary[k] for k in ("gpus", "healthy", "degraded", "unhealthy", "missing")}
    stats["s-power"] = "–" if summary["power_w"] is None else f"{summary['power_w']:,.0f}"
    page = template
    for key, value in stats.items():
        page = page.replace(f'<b id="{key}">–</b>', f'<b id="{key}">{escape(str(value))}</b>')
    page = page.replace("<!--GRID-->", grid(gpus)).replace("<!--ALERTS-->", alert_rows(alerts["alerts"]))
    page = page.replace("<!--LADDER-->", ladder_items())
    page = page.replace("<!--LIFECYCLE-SAID-->", lifecycle_said(decided))
    page = page.replace("<!--LIFECYCLE-->", lifecycle_rows(decided))
    for marker, drawn in (await usage_view(state)).items():
        page = page.replace(marker, drawn)
    return page.replace("<!--ALERT-TOTAL-->", str(alerts["total"]))


def add_web(app: FastAPI) -> None:
    template = (STATIC / "index.html").read_text()
    icon = favicon()
    assets = Path(swagger_ui_bundle.swagger_ui_path)
    app.mount("/static/swagger-ui", StaticFiles(directory=assets), name="swagger-ui")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def fleet_page(state: State, request: Request) -> HTMLResponse:
        """The fleet at a glance, drawn on the server; its script keeps it live. No caller: the shell."""
        return HTMLResponse(
            await render_page(state, template, request.scope.get(IDENTITY)),
            headers={"Cache-Control": "no-store"},
        )

    @app.post("/login", include_in_schema=False)
    async def login(state: State, request: Request) -> JSONResponse:
        """Check a token (JSON `{"token": ...}`) and keep it in the page's cookie; refusals count as any."""
        auth, client = state.authenticator, client_address(request.scope)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"detail": 'send JSON: {"token": "..."}'}, status_code=415)
        if wait := auth.throttle.throttled_for(client):
            auth.refused(client, "throttled")
            return JSONResponse(
                {"detail": "too many refused requests from this address"},
                status_code=429,
                headers={"Retry-After": str(int(wait) + 1)},
            )
        try:
            sent = json.loads(await request.body())
            token = sent.get("token") if isinstance(sent, dict) else None
            if not isinstance(token, str) or not token.strip():
                raise AuthError("missing", 'send the token as {"token": "..."}')
            identity = await auth.identity(token.strip())
        except ValueError:
            return JSONResponse({"detail": "the body is not JSON"}, status_code=400)
        except AuthError as e:
            auth.refused(client, e.reason)
            return JSONResponse({"detail": e.detail}, status_code=e.status)
        done = JSONResponse({"subject": identity.subject, "role": identity.role})
        done.set_cookie(
            COOKIE,
            token.strip(),
            httponly=True,
            samesite="strict",
            path="/",
            secure=request.url.scheme == "https",
        )
        return done

    @app.post("/logout", include_in_schema=False)
    async def logout() -> Response:
        """Forget the page's cookie."""
        done = Response(status_code=204)
        done.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return done

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon_ico() -> Response:
        return Response(icon, media_type="image/x-icon", headers={"Cache-Control": "max-age=86400"})

    swagger = get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="gpu-health API",
        swagger_js_url="/static/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url="/static/swagger-ui/swagger-ui.css",
        swagger_favicon_url="/favicon.ico",
    )
    swagger_csp = policy(bytes(swagger.body).decode())  # its one inline script, allowed by its hash

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(bytes(swagger.body), headers={"Content-Security-Policy": swagger_csp})
