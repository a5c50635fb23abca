"""jobcap in Django's admin (found by the admin's autodiscovery).

* "Dead jobs" under "jobcap" on the admin index: the page of views.py, at the admin's URL of
  the DeadJob model (/admin/jobcap_admin/deadjob/). Staff users need its view permission to
  see it and its change permission to requeue and purge.
* Django-Q's "Resubmit selected tasks to queue" on its failed tasks, when Django-Q's broker is
  jobcap's: the failed task's job is requeued (jobcap.requeue_job, with the user's name in the
  reason kept in its history), so it keeps its id, its history and its counters, instead of a
  new job with a fresh budget. A task whose job is gone (past jobcap.dead_retention) is
  enqueued again as Django-Q does; one whose job is still pending or running is left alone.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.db import DatabaseError, transaction
from django.urls import path

from . import views
from .models import DeadJob


@admin.register(DeadJob)
class DeadJobAdmin(admin.ModelAdmin):

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        info = self.model._meta.app_label, self.model._meta.model_name
        view = self.admin_site.admin_view
        return [
            path("", view(self.page), name="%s_%s_changelist" % info),
            path("requeue/", view(self.requeue), name="%s_%s_requeue" % info),
            path("purge/", view(self.purge), name="%s_%s_purge" % info),
        ]

    def page(self, request):
        if not self.has_view_or_change_permission(request):
            from django.core.exceptions import PermissionDenied
            raise PermissionDenied
        return views.dead_jobs(request, self)

    def requeue(self, request):
        from django.views.decorators.http import require_POST
        return require_POST(lambda r: views.requeue(r, self))(request)

    def purge(self, request):
        from django.views.decorators.http import require_POST
        return require_POST(lambda r: views.purge(r, self))(request)


# --- Django-Q's Resubmit ----------------------------------------------------------------------

def _jobcap_broker() -> bool:
    """Whether Django-Q's configured broker is jobcap's."""
    try:
        from django_q.conf import Conf
        from django.utils.module_loading import import_string
        from jobcap.contrib.django_q import Broker
        return bool(Conf.BROKER_CLASS) and issubclass(import_string(Conf.BROKER_CLASS), Broker)
    except Exception:   # Django-Q not installed or not configured, or another broker
        return False


def retry_failed(modeladmin, request, queryset):
    """Django-Q's action, by its name, on jobcap: requeue each failed task's job."""
    from django_q.conf import Conf
    from django_q.tasks import async_task
    from jobcap.contrib.django_q import dedupe_key_of, options
    db = options().get("database", "default")
    who = request.user.get_username()
    for task in queryset:
        try:
            with transaction.atomic(using=db):
                found = _rows(db, "SELECT job_id, state::text AS state, attempts,"
                                  "       coalesce(j.max_attempts, q.max_attempts) AS cap"
                                  "  FROM jobcap.jobs j JOIN jobcap.queues q USING (queue)"
                                  " WHERE j.queue = %s AND j.dedupe_key = %s"
                                  "   AND j.state = ANY ('{pending,running,dead}')",
                              (Conf.PREFIX, dedupe_key_of(task.id)))
                if not found:
                    async_task(task.func, *task.args or (), hook=task.hook, **task.kwargs or {})
                    task.delete()
                    messages.warning(request, f"{task.name}: its job is no longer kept "
                                              "(past its retention, or enqueued under a "
                                              "jobcap_dedupe_key of its own): enqueued as a "
                                              "new job, with a new budget of attempts.")
                    continue
                job = found[0]
                if job["state"] != "dead":
                    messages.info(request, f"{task.name}: its job {job['job_id']} is "
                                           f"{job['state']} (attempt {job['attempts']} of "
                                           f"{job['cap']}): left as it is.")
                    continue
                reason = f"resubmitted in Django-Q's admin by {who}"
                if _rows(db, "SELECT jobcap.requeue_job(%s, %s) AS ok",
                         (job["job_id"], reason))[0]["ok"]:
                    task.delete()
                    messages.success(request, f"{task.name}: job {job['job_id']} requeued "
                                              f"after {job['attempts']} attempts ({reason}).")
        except DatabaseError as error:
            messages.error(request, f"{task.name}: not resubmitted: {error}".strip()
                           + " (resubmitting requeues the task's jobcap job: the site's "
                             "database role needs jobcap_operator's privileges)")


retry_failed.short_description = "Resubmit selected tasks to queue (requeue their jobcap jobs)"


def _rows(db, query, params):
    from django.db import connections
    with connections[db].cursor() as cursor:
        cursor.execute(query, params)
        columns = [c.name for c in cursor.description]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]


def _replace_resubmit() -> None:
    from django.apps import apps
    if not apps.is_installed("django_q"):
        return
    try:
        import django_q.admin as djq_admin
        from django_q.models import Failure
    except ImportError:
        return
    if not _jobcap_broker() or not admin.site.is_registered(Failure):
        return
    registered = type(admin.site._registry[Failure])
    actions = list(registered.actions or ())
    if djq_admin.retry_failed not in actions:
        return      # the project registered its own admin for Failure: left alone
    jobcap_fail_admin = type("JobcapFailAdmin", (registered,), {
        "actions": [retry_failed if a is djq_admin.retry_failed else a for a in actions],
        "__module__": __name__})
    admin.site.unregister(Failure)
    admin.site.register(Failure, jobcap_fail_admin)


_replace_resubmit()
