"""The jobcap page of Django's admin: what is dead, why, and the operator's two actions.

The page is served by the admin (admin.py: "Dead jobs" under "jobcap" on the admin index) to
staff users with the view permission of jobcap_admin.DeadJob; requeue and purge need its change
permission (superusers have both). Every query runs on Django's database connection as its
role, and jobcap's functions check that role again: without jobcap_operator's privileges the
page says what the DBA grants, and does nothing.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connections, transaction
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from .payloads import describe

PAYLOAD_EXCERPT = 300
PAYLOAD_DECODED_MAX = 65536      # bytes of payload fetched to be decoded, per dead job
DEAD_PAGE = 200
#: History kinds of attempts that ended without a report (a snooze is neither: no attempt ends).
CRASHES = ("lease_expired", "crashed", "claim_rolled_back", "timed_out")


def alias() -> str:
    return getattr(settings, "JOBCAP_DATABASE", "default")


def rows(query, params=()):
    with connections[alias()].cursor() as cursor:
        cursor.execute(query, params)
        columns = [c.name for c in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]


def is_operator() -> bool:
    return rows("SELECT pg_catalog.pg_has_role(current_user, 'jobcap_operator', 'USAGE')"
                "    OR (SELECT rolsuper FROM pg_catalog.pg_roles"
                "         WHERE rolname = current_user) AS ok")[0]["ok"]


def database_role() -> str:
    return rows("SELECT current_user AS role")[0]["role"]


def page_url(queue: str = "") -> str:
    url = reverse("admin:jobcap_admin_deadjob_changelist")
    return url + (f"?queue={queue}" if queue else "")


def dead_jobs(request, model_admin):
    context = dict(model_admin.admin_site.each_context(request), title="jobcap: dead jobs",
                   opts=model_admin.model._meta,
                   can_change=model_admin.has_change_permission(request))
    if not is_operator():
        context["not_operator"] = database_role()
        return TemplateResponse(request, "jobcap_admin/dead_jobs.html", context)
    queues = rows(
        "SELECT q.queue, q.max_attempts,"
        "   count(*) FILTER (WHERE j.state = 'dead') AS dead,"
        "   count(*) FILTER (WHERE j.state = 'pending') AS pending,"
        "   count(*) FILTER (WHERE j.state = 'running') AS running,"
        # compat(0.2.0): compared as text, as a 0.2.0 job_state has no 'waiting'.
        "   count(*) FILTER (WHERE j.state::text = 'waiting') AS waiting"
        "  FROM jobcap.queues q LEFT JOIN jobcap.jobs j ON j.queue = q.queue"
        " GROUP BY q.queue, q.max_attempts ORDER BY q.queue")
    queue = request.GET.get("queue") or next((q["queue"] for q in queues if q["dead"]), None)
    dead = []
    if queue:
        dead = rows(
            "SELECT j.job_id, j.attempts, coalesce(j.max_attempts, q.max_attempts) AS cap,"
            "   j.finished_at, left(j.payload::text, %s) AS payload_text,"
            "   length(j.payload::text) > %s AS payload_cut,"
            "   CASE WHEN pg_catalog.pg_column_size(j.payload) <= %s THEN j.payload END"
            "     AS payload,"
            "   ARRAY(SELECT e.kind || ' (attempt ' || e.attempt || '): ' ||"
            "                coalesce(left(e.error, 300), '')"
            "           FROM jobcap.job_errors e WHERE e.job_id = j.job_id"
            "            AND e.kind IN ('error', 'lease_expired', 'crashed',"
            "                           'claim_rolled_back', 'timed_out', 'snoozed')"
            "          ORDER BY e.seq DESC LIMIT 3) AS failures"
            "  FROM jobcap.jobs j JOIN jobcap.queues q ON q.queue = j.queue"
            " WHERE j.queue = %s AND j.state = 'dead'"
            " ORDER BY j.finished_at DESC, j.job_id DESC LIMIT %s",
            (PAYLOAD_EXCERPT, PAYLOAD_EXCERPT, PAYLOAD_DECODED_MAX, queue, DEAD_PAGE))
        for job in dead:
            job["crashes"] = sum(f.split(" ", 1)[0] in CRASHES for f in job["failures"])
            job["task"] = (describe(job["payload"], queue) if job["payload"] is not None else
                           {"kind": "large", "task": "", "args": "",
                            "note": "payload too large to decode here"})
    # compat(0.2.0): timed_out and snoozes are 0.3.0's columns; without them the page shows
    # neither.
    top = rows("SELECT t.*, t.state::text AS state FROM jobcap.top_failing_jobs(NULL, 10) t")
    context.update(queues=queues, queue=queue, dead=dead, top=top)
    return TemplateResponse(request, "jobcap_admin/dead_jobs.html", context)


def _changer(request, model_admin):
    if not model_admin.has_change_permission(request):
        raise PermissionDenied
    if not is_operator():
        raise PermissionDenied("the database role of this site is not a jobcap operator")


def requeue(request, model_admin):
    _changer(request, model_admin)
    reason = (request.POST.get("reason") or "").strip()
    job_ids = [int(j) for j in request.POST.getlist("job") if j.isdigit()]
    queue = request.POST.get("queue", "")
    back = page_url(queue)
    if not job_ids:
        messages.error(request, "Select the jobs to requeue.")
        return redirect(back)
    if not reason:
        messages.error(request, "Say why the jobs deserve more attempts: the reason is kept in "
                                "each job's history.")
        return redirect(back)
    who = request.user.get_username()
    done = 0
    try:
        with transaction.atomic(using=alias()):
            for job_id in job_ids:
                done += bool(rows("SELECT jobcap.requeue_job(%s, %s) AS ok",
                                  (job_id, f"{reason} (by {who})"))[0]["ok"])
    except DatabaseError as error:
        messages.error(request, f"Nothing requeued: {error}")
        return redirect(back)
    messages.success(request, f"Requeued {done} job(s).")
    return redirect(back)


def purge(request, model_admin):
    _changer(request, model_admin)
    queue = request.POST.get("queue", "")
    back = page_url(queue)
    if request.POST.get("confirm") != queue or not queue:
        messages.error(request, "Type the queue's name to confirm the purge.")
        return redirect(back)
    purged = 0
    try:
        while True:
            n = rows("SELECT jobcap.purge_dead(%s, NULL, NULL, NULL, 1000) AS n", (queue,))[0]["n"]
            purged += n
            if n < 1000:
                break
    except DatabaseError as error:
        messages.error(request, f"Purge stopped: {error}")
        return redirect(back)
    messages.success(request, f"Purged {purged} dead job(s) of {queue}.")
    return redirect(back)
