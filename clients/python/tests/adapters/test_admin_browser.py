"""The jobcap admin page in a real browser (headless Chromium through selenium).

A poison job dies at its cap (two reported errors and one attempt whose lease lapsed); a staff
user logs in, sees it dead with 3/3 attempts and the kind of each failure, requeues it with a
reason, and sees it pending again. Screenshots go to build/adapters/screenshots/.
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import psycopg

from common import HERE, start_server, wait_for

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "..", ".."))
SHOTS = os.path.join(ROOT, "build", "adapters", "screenshots")
server = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sql(query, params=None, conninfo=None):
    with psycopg.connect(conninfo or server.conninfo, autocommit=True) as conn:
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
                       JOBCAP_TEST_CACHE_DIR=os.path.join(server.dir, "cache"))
        manage = [sys.executable, "-m", "django"]
        subprocess.run(manage + ["migrate", "-v", "0"], cwd=HERE, env=cls.env, check=True)
        subprocess.run(manage + ["shell", "-c",
                                 "from django.contrib.auth.models import User;"
                                 "User.objects.create_superuser('ops', 'ops@example.com', 'pw-ops-1');"
                                 "User.objects.create_user('clerk', 'c@example.com', 'pw-clerk-1')"],
                       cwd=HERE, env=cls.env, check=True)
        cls.port = free_port()
        cls.log = open(os.path.join(server.dir, "runserver.log"), "w+")
        cls.web = subprocess.Popen(manage + ["runserver", "--noreload", "--insecure",
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

    def shot(self, name):
        path = os.path.join(SHOTS, name)
        self.browser.save_screenshot(path)
        return path

    def login(self, user, password):
        from selenium.webdriver.common.by import By
        b = self.browser
        b.delete_all_cookies()
        b.get(self.base + "/admin/login/?next=/admin/jobcap/")
        b.find_element(By.ID, "id_username").send_keys(user)
        b.find_element(By.ID, "id_password").send_keys(password)
        b.find_element(By.CSS_SELECTOR, "input[type=submit]").click()

    def make_poison(self):
        """A job dead at its cap: two reported errors, then a lease that lapsed (a crash)."""
        sql("SELECT jobcap.create_queue('media', max_attempts => 3, backoff_base => '0',"
            " backoff_max => '0')")
        job_id = sql("SELECT jobcap.enqueue_job('media', '{\"file\": \"corrupt.mp4\", "
                     "\"size\": 7340032}')")[0][0]
        for n in (1, 2):
            sql("SELECT jobcap.fail_job(job_id, fence, 'decoder: invalid NAL unit') FROM"
                " jobcap.claim_job('media', 'decoder-1')")
        sql("SELECT count(*) FROM jobcap.claim_job('media', 'decoder-2', 1, '1 second')")
        wait_for(lambda: sql("SELECT state::text FROM jobcap.jobs WHERE job_id = %s",
                             (job_id,))[0][0] == "dead", timeout=20, what="poison dead")
        return job_id

    def test_requeue_a_poison_job(self):
        from selenium.webdriver.common.by import By
        job_id = self.make_poison()
        self.login("ops", "pw-ops-1")
        b = self.browser
        wait_for(lambda: "Dead jobs of" in b.page_source, timeout=15, what="the page")
        row = b.find_element(By.ID, f"job-{job_id}")
        self.assertEqual(row.find_element(By.CLASS_NAME, "attempts").text, "3/3")
        kinds = [li.get_attribute("class") for li in row.find_elements(By.TAG_NAME, "li")]
        self.assertEqual(kinds, ["crash", "error", "error"])
        self.assertIn("corrupt.mp4", row.text)
        self.assertIn("decoder: invalid NAL unit", row.text)
        top = b.find_element(By.ID, "top-failing").text
        self.assertIn(str(job_id), top)
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

    def test_not_for_non_staff(self):
        self.login("clerk", "pw-clerk-1")
        b = self.browser
        time.sleep(0.5)
        self.assertNotIn("Dead jobs", b.page_source)
        self.assertIn("/admin/login/", b.current_url)
        self.shot("3-non-staff-refused.png")


if __name__ == "__main__":
    unittest.main()
