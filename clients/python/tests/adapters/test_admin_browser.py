"""The jobcap admin page in a real browser (headless Chromium through selenium).

Dead jobs of three kinds: a plain jobcap job (a poison file: two reported errors and one attempt
whose lease lapsed), a Django-Q task failed by a real `qcluster` until its cap, and a Celery
task sent through the kombu transport and failed until its cap. A staff user finds the page on
the admin index, sees each task's name and arguments decoded (never the base64 of the payload),
with nothing wider than the window, requeues the poison job with a reason, and resubmits the
Django-Q task from Django-Q's own "Failed tasks" page: the same job is requeued, with the
reason in its history. A user who is not staff is sent to the login page. Screenshots (of the
whole page) go to build/adapters/screenshots/.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import urllib.request

import psycopg

from common import HERE, start_server, wait_for

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
SHOTS = os.path.join(ROOT, "build", "adapters", "screenshots")
PAGE = "/admin/jobcap_admin/deadjob/"
LONG_TOKEN = "s3://scans/" + "a1b2c3d4e5" * 30 + ".pdf"     # no place to break a line
server = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sql(query, params=None):
    with psycopg.connect(server.conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def setUpModule():
    global server
    server = start_server()


def tearDownModule():
    if server is not None:
        server.stop()


class AdminBrowserTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        cls.env = dict(os.environ,
                       PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", ".."), HERE]),
                       DJANGO_SETTINGS_MODULE="djq_settings", JOBCAP_TEST_HOST=server.dir,
                       JOBCAP_TEST_PORT=str(server.port), JOBCAP_TEST_URLCONF="admin_urls",
                       JOBCAP_TEST_Q_CLUSTER="cluster", JOBCAP_TEST_CONNINFO=server.conninfo)
        cls.manage = [sys.executable, "-m", "django"]
        subprocess.run(cls.manage + ["migrate", "-v", "0"], cwd=HERE, env=cls.env, check=True)
        cls.django("from django.contrib.auth.models import User;"
                   "User.objects.create_superuser('ops', 'ops@example.com', 'pw-ops-1');"
                   "User.objects.create_user('clerk', 'c@example.com', 'pw-clerk-1')")
        cls.poison = cls.make_poison()
        cls.djq_job, cls.djq_task = cls.make_django_q_failure()
        cls.celery_job = cls.make_celery_failure()
        cls.render_job, cls.render_waiting = cls.make_timed_out_and_waiting()
        cls.port = free_port()
        cls.log = open(os.path.join(server.dir, "runserver.log"), "w+")
        cls.web = subprocess.Popen(cls.manage + ["runserver", "--noreload", "--insecure",
                                                 f"127.0.0.1:{cls.port}"],
                                   cwd=HERE, env=cls.env, stdout=cls.log,
                                   stderr=subprocess.STDOUT)
        cls.base = f"http://127.0.0.1:{cls.port}"
        wait_for(lambda: cls._up(), timeout=30, what="runserver up")
        cls.profile = tempfile.mkdtemp(prefix="jobcap-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     "--window-size=1400,1000", f"--user-data-dir={cls.profile}"):
            options.add_argument(flag)
        cls.browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"),
                                       options=options)
        cls.browser.set_page_load_timeout(30)
        os.makedirs(SHOTS, exist_ok=True)

    @classmethod
    def django(cls, code):
        return subprocess.run(cls.manage + ["shell", "-c", textwrap.dedent(code)], cwd=HERE,
                              env=cls.env, check=True, capture_output=True,
                              text=True).stdout.strip()

    @classmethod
    def _up(cls):
        try:
            urllib.request.urlopen(cls.base + "/admin/login/", timeout=2)
            return True
        except OSError:
            return False

    @classmethod
    def tearDownClass(cls):
        cls.browser.quit()
        cls.web.terminate()
        cls.web.wait(10)
        cls.log.close()
        shutil.rmtree(cls.profile, ignore_errors=True)

    # --- the dead jobs --------------------------------------------------------------------------

    @classmethod
    def make_poison(cls):
        """A plain job dead at its cap: two reported errors, then a lease that lapsed."""
        sql("SELECT jobcap.create_queue('media', max_attempts => 3, backoff_base => '0',"
            " backoff_max => '0')")
        job_id = sql("SELECT jobcap.enqueue_job('media', %s::jsonb)",
                     (f'{{"file": "corrupt.mp4", "size": 7340032, "source": "{LONG_TOKEN}"}}',)
                     )[0][0]
        for n in (1, 2):
            sql("SELECT jobcap.fail_job(job_id, fence, 'decoder: invalid NAL unit') FROM"
                " jobcap.claim_job('media', 'decoder-1')")
        sql("SELECT count(*) FROM jobcap.claim_job('media', 'decoder-2', 1, '1 second')")
        wait_for(lambda: cls.state(job_id) == "dead", timeout=20, what="poison dead")
        return job_id

    @classmethod
    def make_django_q_failure(cls):
        """A Django-Q task that always raises, run by a real cluster until its cap (3)."""
        log = open(os.path.join(server.dir, "qcluster.log"), "w+")
        cluster = subprocess.Popen(cls.manage + ["qcluster"], cwd=HERE, env=cls.env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            task_id = cls.django(f"""
                from django_q.tasks import async_task
                print(async_task('djq_tasks.boom', 'scan-0042.pdf', '{LONG_TOKEN}',
                                 pages=[1, 2, 3], group='scans'))""")
            job_id = sql("SELECT job_id FROM jobcap.jobs WHERE dedupe_key = %s",
                         (f"django-q:{task_id}",))[0][0]
            wait_for(lambda: cls.state(job_id) == "dead", timeout=60, what="django-q task dead")
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(cluster.pid, signal.SIGKILL)
                cluster.wait()
            log.close()
        return job_id, task_id

    @classmethod
    def make_celery_failure(cls):
        """A Celery task message sent through the kombu transport, failed until its cap (3)."""
        subprocess.run([sys.executable, "-c", textwrap.dedent("""
            from celery_app import app
            app.send_task('billing.charge_card', args=('inv-2291', 129.5),
                          kwargs={'currency': 'EUR'}, queue='billing')
            """)], cwd=HERE, env=cls.env, check=True)
        job_id = sql("SELECT max(job_id) FROM jobcap.jobs WHERE queue = 'billing'")[0][0]
        for _ in range(3):
            sql("SELECT jobcap.fail_job(job_id, fence, 'CardDeclined: do not honor') FROM"
                " jobcap.claim_job_by_id(%s, 'celery@billing-1')", (job_id,))
        assert cls.state(job_id) == "dead"
        return job_id

    @classmethod
    def make_timed_out_and_waiting(cls):
        """A job snoozed once (its attempt given back), then timed out at each of its two
        attempts (dead at its cap); and a job waiting on a pending one."""
        sql("SELECT jobcap.create_queue('render', max_attempts => 2, backoff_base => '0',"
            " backoff_max => '0')")
        job_id = sql("SELECT jobcap.enqueue_job('render', '{\"scene\": \"intro\"}')")[0][0]
        sql("SELECT jobcap.snooze_job(job_id, fence, '0') FROM jobcap.claim_job('render', 'r-1')")
        for _ in range(2):
            sql("SELECT jobcap.time_out_job(job_id, fence, 'ran past its max_run_time (10 min)')"
                " FROM jobcap.claim_job('render', 'r-1')")
        assert cls.state(job_id) == "dead"
        parent = sql("SELECT jobcap.enqueue_job('render', '{\"scene\": \"credits\"}')")[0][0]
        child = sql("SELECT jobcap.enqueue_job('render', '{\"scene\": \"final\"}',"
                    " depends_on => ARRAY[%s]::bigint[])", (parent,))[0][0]
        assert cls.state(child) == "waiting"
        return job_id, child

    @staticmethod
    def state(job_id):
        return sql("SELECT state::text FROM jobcap.jobs WHERE job_id = %s", (job_id,))[0][0]

    # --- the browser ----------------------------------------------------------------------------

    def shot(self, name):
        """A screenshot of the whole page (the window made as tall as the page)."""
        b = self.browser
        height = b.execute_script("return document.documentElement.scrollHeight")
        width = b.get_window_size()["width"]
        b.set_window_size(width, max(1000, min(int(height) + 140, 6000)))
        path = os.path.join(SHOTS, name)
        b.save_screenshot(path)
        b.set_window_size(width, 1000)
        return path

    def login(self, user, password, next_url=PAGE):
        from selenium.webdriver.common.by import By
        b = self.browser
        b.delete_all_cookies()
        b.get(self.base + "/admin/login/?next=" + next_url)
        b.find_element(By.ID, "id_username").send_keys(user)
        b.find_element(By.ID, "id_password").send_keys(password)
        b.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        # The login's redirect must land before the next navigation: a get() issued while the
        # POST is in flight can be overtaken by its redirect (to the first queue's page).
        wait_for(lambda: "/admin/login/" not in b.current_url
                 or "errornote" in b.page_source, timeout=15, what=f"{user}'s login")

    def open_queue(self, queue):
        from selenium.webdriver.common.by import By
        self.browser.get(f"{self.base}{PAGE}?queue={queue}")

        def shown():
            names = self.browser.find_elements(By.ID, "queue-name")
            return bool(names) and names[0].text == queue
        wait_for(shown, timeout=15, what=f"the page of {queue}")

    def assert_fits(self):
        """Nothing wider than the window: no horizontal scrolling, every cell inside its table."""
        overflow = self.browser.execute_script("""
            const doc = document.documentElement;
            const out = [];
            if (doc.scrollWidth > doc.clientWidth)
              out.push('page ' + doc.scrollWidth + ' > ' + doc.clientWidth);
            for (const table of document.querySelectorAll('.jobcap table')) {
              const right = table.getBoundingClientRect().right;
              for (const cell of table.querySelectorAll('td')) {
                if (cell.getBoundingClientRect().right > right + 1
                    || cell.scrollWidth > cell.clientWidth + 1)
                  out.push(table.id + ': ' + cell.textContent.trim().slice(0, 40));
              }
            }
            return out;""")
        self.assertEqual(overflow, [])

    def test_1_index_links_the_page(self):
        from selenium.webdriver.common.by import By
        self.login("ops", "pw-ops-1", next_url="/admin/")
        b = self.browser
        wait_for(lambda: "Site administration" in b.page_source, timeout=15, what="the index")
        link = b.find_element(By.CSS_SELECTOR, "a[href='/admin/jobcap_admin/deadjob/']")
        self.assertEqual(link.text, "Dead jobs")
        self.assertIn("jobcap", b.find_element(By.CSS_SELECTOR, "div.app-jobcap_admin").text
                      .lower())
        self.shot("0-admin-index.png")
        link.click()
        wait_for(lambda: "Dead jobs of" in b.page_source, timeout=15, what="the page")
        b.get(self.base + "/admin/jobcap/?queue=media")     # the page's old address
        wait_for(lambda: "Dead jobs of" in b.page_source, timeout=15, what="the redirect")
        self.assertEqual(b.current_url, f"{self.base}{PAGE}?queue=media")

    def test_2_payloads_decoded(self):
        from selenium.webdriver.common.by import By
        self.login("ops", "pw-ops-1")
        b = self.browser
        for queue, job_id, task, args, failure in (
                ("django_q_test", self.djq_job, "djq_tasks.boom",
                 "('scan-0042.pdf', 's3://scans/a1b2c3d4e5", "cannot process scan-0042.pdf"),
                ("billing", self.celery_job, "billing.charge_card",
                 "('inv-2291', 129.5) {'currency': 'EUR'}", "CardDeclined: do not honor")):
            self.open_queue(queue)
            row = b.find_element(By.ID, f"job-{job_id}")
            self.assertEqual(row.find_element(By.CLASS_NAME, "attempts").text, "3/3")
            self.assertEqual(row.find_element(By.CLASS_NAME, "task-name").text, task)
            self.assertTrue(row.find_element(By.CLASS_NAME, "task-args").text.startswith(args),
                            row.find_element(By.CLASS_NAME, "task-args").text)
            self.assertIn(failure, row.text)
            self.assertNotIn("gAW", row.text)          # no base64 of a pickle shown
            self.assertNotIn("W1s", row.text)          # nor of a kombu body
            self.assert_fits()
            self.shot(f"4-{queue}-decoded.png")
        note = b.find_element(By.ID, f"job-{self.celery_job}").find_element(
            By.CLASS_NAME, "task-note").text
        self.assertEqual(note, "Celery task (arguments as Celery's argsrepr/kwargsrepr)")

    def test_3_requeue_a_poison_job(self):
        from selenium.webdriver.common.by import By
        job_id = self.poison
        self.login("ops", "pw-ops-1")
        b = self.browser
        self.open_queue("media")
        row = b.find_element(By.ID, f"job-{job_id}")
        self.assertEqual(row.find_element(By.CLASS_NAME, "attempts").text, "3/3")
        kinds = [li.get_attribute("class") for li in row.find_elements(By.TAG_NAME, "li")]
        self.assertEqual(kinds, ["crash", "error", "error"])
        self.assertIn("corrupt.mp4", row.text)
        self.assertIn("decoder: invalid NAL unit", row.text)
        top = b.find_element(By.ID, "top-failing").text
        self.assertIn(str(job_id), top)
        self.assert_fits()
        self.shot("1-dead-at-cap.png")

        b.find_element(By.ID, f"select-{job_id}").click()
        b.find_element(By.ID, "reason").send_keys("decoder upgraded")
        b.find_element(By.ID, "requeue").click()
        wait_for(lambda: "Requeued 1 job(s)." in b.page_source, timeout=15, what="requeued")
        self.shot("2-requeued.png")
        self.assertEqual(len(b.find_elements(By.ID, f"job-{job_id}")), 0)
        state, attempts, cap = sql("SELECT state::text, attempts, max_attempts FROM jobcap.jobs"
                                   " WHERE job_id = %s", (job_id,))[0]
        self.assertEqual((state, attempts, cap), ("pending", 3, 6))
        media = b.find_element(By.XPATH, "//table[@id='queues']//tr[td/a[text()='media']]")
        self.assertEqual([td.text for td in media.find_elements(By.TAG_NAME, "td")][2:4],
                         ["0", "1"])
        history = sql("SELECT kind, error FROM jobcap.job_errors WHERE job_id = %s"
                      " ORDER BY seq DESC LIMIT 1", (job_id,))
        self.assertEqual(history, [("requeued", "decoder upgraded (by ops)")])

    def test_4_resubmit_from_django_q_requeues_the_job(self):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
        self.login("ops", "pw-ops-1", next_url="/admin/django_q/failure/")
        b = self.browser
        wait_for(lambda: "_selected_action" in b.page_source, timeout=15,
                 what="Django-Q's failed tasks")
        jobs_before = sql("SELECT count(*) FROM jobcap.jobs")[0][0]
        b.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{self.djq_task}']"
                       ).click()
        action = Select(b.find_element(By.NAME, "action"))
        self.assertIn("Resubmit selected tasks to queue (requeue their jobcap jobs)",
                      [o.text for o in action.options])
        action.select_by_value("retry_failed")
        b.find_element(By.CSS_SELECTOR, "button[name=index]").click()
        wait_for(lambda: "requeued after 3 attempts" in b.page_source, timeout=15,
                 what="the resubmit's message")
        self.shot("6-django-q-resubmitted.png")
        message = b.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text
        self.assertRegex(message, rf"job {self.djq_job} requeued after 3 attempts "
                                  r"\(resubmitted in Django-Q's admin by ops\)\.$")
        self.assertEqual(sql("SELECT count(*) FROM jobcap.jobs")[0][0], jobs_before)
        self.assertEqual(sql("SELECT state::text, attempts, max_attempts FROM jobcap.jobs"
                             " WHERE job_id = %s", (self.djq_job,)), [("pending", 3, 6)])
        self.assertEqual(sql("SELECT kind, error FROM jobcap.job_errors WHERE job_id = %s"
                             " ORDER BY seq DESC LIMIT 1", (self.djq_job,)),
                         [("requeued", "resubmitted in Django-Q's admin by ops")])

    def test_5_narrow_window(self):
        self.login("ops", "pw-ops-1")
        b = self.browser
        b.set_window_size(1024, 1000)
        try:
            self.open_queue("django_q_test" if self.state(self.djq_job) == "dead" else "billing")
            self.assert_fits()
            self.shot("7-narrow-1024.png")
        finally:
            b.set_window_size(1400, 1000)

    def test_7_timed_out_snoozed_and_waiting(self):
        from selenium.webdriver.common.by import By
        self.login("ops", "pw-ops-1")
        b = self.browser
        self.open_queue("render")
        row = b.find_element(By.ID, f"job-{self.render_job}")
        self.assertEqual(row.find_element(By.CLASS_NAME, "attempts").text, "2/2")
        items = row.find_elements(By.TAG_NAME, "li")
        self.assertEqual([li.get_attribute("class") for li in items],
                         ["crash", "crash", "snooze"])
        self.assertTrue(items[0].text.startswith("timed_out (attempt 2): ran past its "
                                                 "max_run_time"), items[0].text)
        self.assertTrue(items[2].text.startswith("snoozed (attempt 1)"), items[2].text)
        self.assertIn("2 of these ended without a report", row.text)
        render = b.find_element(By.XPATH, "//table[@id='queues']//tr[td/a[text()='render']]")
        self.assertEqual(render.find_element(By.CLASS_NAME, "waiting-count").text, "1")
        top = b.find_element(By.ID, f"top-{self.render_job}")
        self.assertIn("of which 2 timed out", top.find_element(By.CLASS_NAME, "top-failures").text)
        self.assertEqual(top.find_element(By.CLASS_NAME, "top-snoozes").text, "1")
        self.assert_fits()
        self.shot("8-timed-out-snoozed-waiting.png")

    def test_6_not_for_non_staff(self):
        self.login("clerk", "pw-clerk-1")
        b = self.browser
        time.sleep(0.5)
        self.assertNotIn("Dead jobs", b.page_source)
        self.assertIn("/admin/login/", b.current_url)
        self.shot("3-non-staff-refused.png")


if __name__ == "__main__":
    unittest.main()
