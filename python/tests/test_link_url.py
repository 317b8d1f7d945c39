"""Link URLs: one set of rules in both languages. test/fixtures/link-urls.json lists bad and good URLs;
test/cpu/link-url.test.ts reads the same list for src/link/transport/link-url.ts. Every bad one is an IpcError
ERR_INVALID_URL naming the accepted forms, from parse_url and from listen()/connect() whatever their
options (never taken for a link name)."""
from __future__ import annotations

import json
import os
import socket
import unittest

import cuda_ipc
from cuda_ipc import IpcError
from cuda_ipc.link.transport.link_url import LINK_URL_FORMS, is_url, parse_url

LIST = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "link-urls.json")
TOKEN = "link-url-test-token-0123456789"
FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6, 0: 0}


def load() -> dict:
    with open(LIST, encoding="utf-8") as f:
        return json.load(f)


def whats(case: dict) -> list[bool]:
    """The ``listening`` flags a case applies to."""
    return [True, False] if case["for"] == "both" else [case["for"] == "listen"]


class LinkUrlTest(unittest.TestCase):
    def setUp(self) -> None:
        self.list = load()

    def assert_invalid(self, case: dict, error: IpcError) -> None:
        self.assertEqual(error.code, "ERR_INVALID_URL", str(error))
        self.assertIn(case["says"], str(error))
        self.assertIn(LINK_URL_FORMS, str(error), "the message names the accepted forms")
        self.assertNotRegex(str(error), "[\n\r]", "control characters are escaped")

    def test_the_shared_list(self) -> None:
        self.assertGreaterEqual(len(self.list["bad"]), 30)
        self.assertGreaterEqual(len(self.list["good"]), 8)
        checked = 0
        for case in self.list["bad"]:
            for listening in whats(case):
                with self.subTest(url=case["url"], listening=listening):
                    with self.assertRaises(IpcError) as cm:
                        parse_url(case["url"], listening)
                    self.assert_invalid(case, cm.exception)
                    checked += 1
        for case in self.list["good"]:
            for listening in whats(case):
                with self.subTest(url=case["url"], listening=listening):
                    got = parse_url(case["url"], listening)
                    self.assertEqual((got.scheme, got.host, got.port, got.family),
                                     (case["scheme"], case["host"], case["port"], FAMILY[case["family"]]))
                    checked += 1
        self.assertGreater(checked, len(self.list["bad"]) + len(self.list["good"]))
        for name in self.list["notUrls"]:
            self.assertFalse(is_url(name), name)
        self.assertTrue(is_url("http://x"))

    def test_listen_and_connect_refuse_every_bad_url_whatever_the_options(self) -> None:
        n = 0
        for case in self.list["bad"]:
            if not is_url(case["url"]):
                continue
            with self.subTest(url=case["url"]):
                if case["for"] != "connect":
                    with self.assertRaises(IpcError) as cm:
                        cuda_ipc.listen(case["url"], token=TOKEN)
                    self.assert_invalid(case, cm.exception)
                    n += 1
                if case["for"] != "listen":
                    with self.assertRaises(IpcError) as cm:
                        cuda_ipc.connect(case["url"], token=TOKEN, timeout=0)
                    self.assert_invalid(case, cm.exception)
                    with self.assertRaises(IpcError) as cm:
                        cuda_ipc.connect(case["url"])
                    self.assert_invalid(case, cm.exception)
                    n += 1
        self.assertGreaterEqual(n, 40)


if __name__ == "__main__":
    unittest.main()
