"""The jobcap page of Django's admin: what is dead, why, and the operator's two actions.

Every query runs on Django's database connection as its role; the page is served only to
active staff users, and only when that role has jobcap_operator's privileges (or is a
superuser): jobcap's functions check the role again, so the page cannot do more than the role
may.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, connections, transaction
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from django.conf import settings

PAYLOAD_EXCERPT = 160
DEAD_PAGE = 200


def _alias() -> str:
    return getattr(settings, "JOBCAP_DATABASE", "default")


def _rows(query, params=()):
    with connections[_alias()].cursor() as cursor:
        cursor.execute(query, params)
        columns = [c.name for c in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]


def _is_operator() -> bool:
    return _rows("SELECT pg_catalog.pg_has_role(current_user, 'jobcap_operator', 'USAGE')"
                 "    OR (SELECT rolsuper FROM pg_catalog.pg_roles"
                 "         WHERE rolname = current_user) AS ok")[0]["ok"]


def _operator_only(view):
    @staff_member_required
    def wrapped(request, *args, **kwargs):
        if not _is_operator():
            raise PermissionDenied("the database role of this site is not a jobcap operator")
        return view(request, *args, **kwargs)
    wrapped.__name__ = view.__name__
    return wrapped


@_operator_only
def dead_jobs(request):
    queues = _rows(
        "SELECT q.queue, q.max_attempts,"
        "   count(*) FILTER (WHERE j.state = 'dead') AS dead,"
        "   count(*) FILTER (WHERE j.state = 'pending') AS pending,"
        "   count(*) FILTER (WHERE j.state = 'running') AS running"
        "  FROM jobcap.queues q LEFT JOIN jobcap.jobs j ON j.queue = q.queue"
        " GROUP BY q.queue, q.max_attempts ORDER BY q.queue")
    queue = request.GET.get("queue") or next((q["queue"] for q in queues if q["dead"]), None)
    dead = []
    if queue:
        dead = _rows(
            "SELECT j.job_id, j.attempts, coalesce(j.max_attempts, q.max_attempts) AS cap,"
            "   j.finished_at, left(j.payload::text, %s) AS payload,"
            "   length(j.payload::text) > %s AS payload_cut,"
            "   ARRAY(SELECT e.kind || ' (attempt ' || e.attempt || '): ' ||"
            "                coalesce(left(e.error, 300), '')"
            "           FROM jobcap.job_errors e WHERE e.job_id = j.job_id"
            "            AND e.kind IN ('error', 'lease_expired')"
            "          ORDER BY e.seq DESC LIMIT 3) AS failures"
            "  FROM jobcap.jobs j JOIN jobcap.queues q ON q.queue = j.queue"
            " WHERE j.queue = %s AND j.state = 'dead'"
            " ORDER BY j.finished_at DESC, j.job_id DESC LIMIT %s",
            (PAYLOAD_EXCERPT, PAYLOAD_EXCERPT, queue, DEAD_PAGE))
        for job in dead:
            job["crashes"] = sum(f.startswith("lease_expired") for f in job["failures"])
    top = _rows("SELECT job_id, queue, state::text AS state, attempts, failures, errors,"
                "       crashes, last_failure_at, last_errors"
                "  FROM jobcap.top_failing_jobs(NULL, 10)")
    context = dict(admin.site.each_context(request), title="jobcap: dead jobs",
                   queues=queues, queue=queue, dead=dead, top=top)
    return render(request, "jobcap_admin/dead_jobs.html", context)


@require_POST
@_operator_only
def requeue(request):
    reason = (request.POST.get("reason") or "").strip()
    job_ids = [int(j) for j in request.POST.getlist("job") if j.isdigit()]
    queue = request.POST.get("queue", "")
    back = reverse("jobcap_admin:dead_jobs") + (f"?queue={queue}" if queue else "")
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
        with transaction.atomic(using=_alias()):
            for job_id in job_ids:
                done += bool(_rows("SELECT jobcap.requeue_job(%s, %s) AS ok",
                                   (job_id, f"{reason} (by {who})"))[0]["ok"])
    except DatabaseError as error:
        messages.error(request, f"Nothing requeued: {error}")
        return redirect(back)
    messages.success(request, f"Requeued {done} job(s).")
    return redirect(back)


@require_POST
@_operator_only
def purge(request):
    queue = request.POST.get("queue", "")
    back = reverse("jobcap_admin:dead_jobs") + (f"?queue={queue}" if queue else "")
    if request.POST.get("confirm") != queue or not queue:
        messages.error(request, "Type the queue's name to confirm the purge.")
        return redirect(back)
    purged = 0
    try:
        while True:
            n = _rows("SELECT jobcap.purge_dead(%s, NULL, NULL, NULL, 1000) AS n", (queue,))[0]["n"]
            purged += n
            if n < 1000:
                break
    except DatabaseError as error:
        messages.error(request, f"Purge stopped: {error}")
        return redirect(back)
    messages.success(request, f"Purged {purged} dead job(s) of {queue}.")
    return redirect(back)
