"""Filter loading, caching and application, and the sample filters in filters/."""

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relay.errors import FilterError
from relay.filters import (
    FilterRecord,
    FilterRuntimeError,
    FilterSpec,
    apply_filters,
    cached_filters,
    load_count,
    load_filter,
    validate_filters,
)

SAMPLES = Path(__file__).resolve().parents[2] / "filters"

GOOD_FILTER = """\
class Keep:
    def __init__(self, filter_id, drop_key):
        self.id = filter_id
        self.drop_key = drop_key.encode()

    def is_allowed(self, record):
        return record.key != self.drop_key


def new(config):
    return Keep(config.get("id", "keep"), config.get("drop_key", "x"))
"""


def record(key=b"k", value=None, headers=None, offset=0):
    return FilterRecord("orders", 3, offset, 1_700_000_000_000, key, value, headers)


def sample(name, **config):
    return load_filter(FilterSpec.from_file(name, SAMPLES / f"{name}.py", config))


def write(tmp_path, text, name="flt.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- samples -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "headers", "expected"),
    [
        ({}, [("region", b"eu")], True),
        ({}, [("region", b"us")], False),
        ({}, [], False),  # missing: denied in allow mode
        ({}, [("Region", b"eu")], False),  # names are case-sensitive
        ({}, [("region", b"us"), ("region", b"eu")], True),  # any occurrence matches
        ({}, [("region", None)], False),  # a null value counts as missing
        ({"mode": "deny"}, [("region", b"eu")], False),
        ({"mode": "deny"}, [("region", b"us")], True),
        ({"mode": "deny"}, [], True),  # missing: allowed in deny mode
        ({"missing": "allow"}, [], True),
        ({"mode": "deny", "missing": "deny"}, [], False),
    ],
)
def test_header_match(config, headers, expected):
    flt = sample("header_match", header="region", values=["eu", "uk"], **config)
    assert flt.is_allowed(record(headers=headers)) is expected


@pytest.mark.parametrize(
    ("config", "value", "expected"),
    [
        ({}, {"user": {"country": "DE"}}, True),
        ({}, {"user": {"country": "US"}}, False),
        ({}, {"user": {"country": 1}}, True),
        ({}, {"user": {"country": 1.0}}, True),  # one JSON number
        ({}, {"user": {"country": "1"}}, False),  # a string is not the number 1
        ({}, {"user": {"country": True}}, False),  # true is not 1
        ({}, {"user": {}}, False),
        ({}, {"user": {"country": None}}, False),
        ({}, {"user": "DE"}, False),
        ({}, b"not json", False),
        ({}, b"\xff\xfe\x00", False),
        ({}, None, False),
        ({"mode": "deny"}, {"user": {"country": "DE"}}, False),
        ({"mode": "deny"}, {"user": {"country": "US"}}, True),
        ({"mode": "deny"}, b"not json", True),
        ({"missing": "allow"}, {"user": {}}, True),
    ],
)
def test_json_field(config, value, expected):
    flt = sample("json_field", field="user.country", values=["DE", 1], **config)
    raw = json.dumps(value).encode() if isinstance(value, dict) else value
    assert flt.is_allowed(record(value=raw)) is expected


@pytest.mark.parametrize(
    ("config", "key", "expected"),
    [
        ({}, b"eu-123", True),
        ({}, b"uk-9", True),
        ({}, b"us-1", False),
        ({}, b"", False),
        ({}, None, False),
        ({"mode": "deny"}, b"eu-123", False),
        ({"mode": "deny"}, b"us-1", True),
        ({"mode": "deny"}, None, True),
        ({"missing": "allow"}, None, True),
    ],
)
def test_key_prefix(config, key, expected):
    flt = sample("key_prefix", prefixes=["eu-", "uk-"], **config)
    assert flt.is_allowed(record(key=key)) is expected


@pytest.mark.parametrize(
    ("name", "config", "complaint"),
    [
        ("header_match", {"values": ["a"]}, '"header" must be a non-empty string'),
        ("header_match", {"header": "h", "values": []}, '"values" must be a non-empty list'),
        ("header_match", {"header": "h", "values": [1]}, '"values" must be a non-empty list'),
        ("json_field", {"values": ["a"]}, '"field" must be a dotted path'),
        ("json_field", {"field": "a..b", "values": ["a"]}, '"field" must be a dotted path'),
        ("json_field", {"field": "a", "values": ["a"], "mode": "keep"}, '"mode" must be'),
        ("key_prefix", {"prefixes": "eu-"}, '"prefixes" must be a non-empty list'),
        ("key_prefix", {"prefixes": ["a"], "missing": "x"}, '"missing" must be'),
        ("key_prefix", {"prefixes": ["a"], "prefix": "b"}, "unknown config keys ['prefix']"),
    ],
)
def test_sample_rejects_bad_config(name, config, complaint):
    spec = FilterSpec.from_file(name, SAMPLES / f"{name}.py", config, section=name)
    with pytest.raises(FilterError) as caught:
        load_filter(spec)
    message = str(caught.value)
    assert message.startswith(f"[filters.{name}]: new(config) raised ValueError: ")
    assert complaint in message


def test_sample_id_is_configurable_for_reuse_under_another_section():
    path = SAMPLES / "key_prefix.py"
    config = {"id": "eu_keys", "prefixes": ["eu-"]}
    flt = load_filter(FilterSpec.from_file("eu_keys", path, config, section="eu_keys"))
    assert flt.id == "eu_keys"


# --- loading errors --------------------------------------------------------------------

BAD_FILTERS = [
    ("def new(config)\n    return 1\n", "syntax error in {path} line 1: expected ':'"),
    ("import no_such_module_ktm\n", "running {path} raised ModuleNotFoundError: No module"),
    ("x = 1\n", "{path} defines no new(config) function"),
    ("new = 3\n", "{path} defines no new(config) function"),
    (
        "def new(config):\n    raise ValueError('need a\\nfield')\n",
        "new(config) raised ValueError: need a field",
    ),
    ("def new(config):\n    return None\n", "new(config) returned None, not a filter object"),
    (
        "def new(config):\n    return object()\n",
        "returned an object of type object with no is_allowed(record)",
    ),
    (
        "class F:\n    is_allowed = 5\n    id = 'pii'\ndef new(config):\n    return F()\n",
        "returned an object of type F with no is_allowed(record)",
    ),
    (
        "class F:\n    def is_allowed(self, r):\n        return True\n"
        "def new(config):\n    return F()\n",
        "returned an object of type F whose id is not a str: None",
    ),
    (
        "class F:\n    id = 'x'\n    def is_allowed(self, r):\n        return True\n"
        "def new(config):\n    return F()\n",
        "filter reports id 'x' but the section is named 'pii'",
    ),
]


@pytest.mark.parametrize(("source", "expected"), BAD_FILTERS)
def test_bad_filter_from_section_names_the_section(tmp_path, source, expected):
    path = write(tmp_path, source)
    spec = FilterSpec.from_file("pii", path, {}, section="pii")
    with pytest.raises(FilterError) as caught:
        validate_filters([spec])
    message = str(caught.value)
    assert message.startswith("[filters.pii]: ")
    assert expected.format(path=path) in message
    assert "\n" not in message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(("source", "expected"), BAD_FILTERS[:-1])
def test_bad_filter_from_flag_names_the_path(tmp_path, source, expected):
    path = write(tmp_path, source)
    spec = FilterSpec.from_file("flt", path, {}, check_id=False)
    with pytest.raises(FilterError) as caught:
        load_filter(spec)
    message = str(caught.value)
    assert message.startswith(f"--filter {path}: ")
    assert expected.format(path=path) in message


def test_flag_filter_id_is_not_checked(tmp_path):
    path = write(tmp_path, GOOD_FILTER, name="other_name.py")
    flt = load_filter(FilterSpec.from_file("other_name", path, {}, check_id=False))
    assert flt.id == "keep"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.py"
    with pytest.raises(FilterError, match=r"^\[filters\.pii\]: file not found: .*nope\.py$"):
        FilterSpec.from_file("pii", path, {}, section="pii")
    with pytest.raises(FilterError, match=r"^--filter .*nope\.py: file not found: "):
        FilterSpec.from_file("nope", path, {}, check_id=False)


def test_bad_on_error_names_the_section(tmp_path):
    path = write(tmp_path, GOOD_FILTER)
    with pytest.raises(FilterError, match=r'^\[filters\.pii\]: on_error must be "stop" or "skip"'):
        FilterSpec.from_file("pii", path, {}, on_error="ignore", section="pii")


def test_duplicate_ids_are_rejected(tmp_path):
    first = FilterSpec.from_file("keep", write(tmp_path, GOOD_FILTER, "a.py"), {}, section="keep")
    second = FilterSpec.from_file("keep", write(tmp_path, GOOD_FILTER, "keep.py"), {})
    with pytest.raises(FilterError, match=r"id 'keep' is also used by \[filters\.keep\]"):
        validate_filters([first, second])


def test_traceback_names_the_real_file_even_after_it_is_gone(tmp_path):
    source = GOOD_FILTER.replace("return record.key", "return 1 / 0 or record.key")
    path = write(tmp_path, source)
    flt = load_filter(FilterSpec.from_file("keep", path, {}, section="keep"))
    path.unlink()
    with pytest.raises(ZeroDivisionError) as caught:
        flt.is_allowed(record())
    last = caught.traceback[-1]
    assert str(last.path) == str(path)
    assert "1 / 0" in str(last.statement)


# --- cache, apply, runtime errors ------------------------------------------------------


def test_cache_loads_each_spec_once_per_process(tmp_path):
    # Unique source text, so earlier tests cannot have cached this spec already.
    path = write(tmp_path, GOOD_FILTER + f"# {tmp_path}\n")
    spec = FilterSpec.from_file("keep", path, {"drop_key": "x"}, section="keep")
    other = FilterSpec.from_file("keep", path, {"drop_key": "y"}, section="keep")
    before = load_count()
    first = cached_filters([spec])
    for _ in range(50):
        assert cached_filters([spec])[0] is first[0]
    assert load_count() == before + 1
    cached_filters([other, spec])  # a different config is a different filter
    assert load_count() == before + 2


def test_apply_filters_returns_first_rejecting_id(tmp_path):
    path = SAMPLES / "key_prefix.py"
    eu = FilterSpec.from_file("eu", path, {"id": "eu", "prefixes": ["eu-"]}, section="eu")
    no_test = FilterSpec.from_file(
        "no_test",
        path,
        {"id": "no_test", "prefixes": ["eu-test"], "mode": "deny"},
        section="no_test",
    )
    filters = validate_filters([eu, no_test])
    assert apply_filters(filters, record(key=b"eu-1")) is None
    assert apply_filters(filters, record(key=b"us-1")) == "eu"
    assert apply_filters(filters, record(key=b"eu-test-1")) == "no_test"
    assert apply_filters([], record()) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("raise KeyError('user')", "filter 'pii' failed: KeyError: 'user'"),
        ("return None", "filter 'pii' failed: is_allowed returned NoneType, expected bool"),
    ],
)
def test_runtime_failure_carries_the_filter_id(tmp_path, body, expected):
    source = f"""\
    class F:
        id = "pii"
        def is_allowed(self, record):
            {body}
    def new(config):
        return F()
    """
    flt = load_filter(FilterSpec.from_file("pii", write(tmp_path, source), {}, section="pii"))
    with pytest.raises(FilterRuntimeError) as caught:
        apply_filters([flt], record())
    assert caught.value.filter_id == "pii"
    assert str(caught.value) == expected
    # It may cross the executor/driver boundary, so it must survive pickling.
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.filter_id, str(copy)) == ("pii", expected)


def test_record_repr_hides_key_and_value():
    shown = repr(record(key=b"secret-key", value=b"secret-value", offset=7))
    assert shown == "FilterRecord(topic='orders' partition=3 offset=7)"


# --- shipping to executors -------------------------------------------------------------

EXECUTOR = """\
import pickle, sys
from relay.filters import FilterRecord, apply_filters, cached_filters
specs = pickle.loads(sys.stdin.buffer.read())
filters = cached_filters(specs)
for key in (b"eu-1", b"us-1"):
    print(apply_filters(filters, FilterRecord("t", 0, 0, 0, key, None, [])))
"""


def test_spec_pickles_and_loads_in_a_fresh_process_without_the_file(tmp_path):
    path = write(tmp_path, (SAMPLES / "key_prefix.py").read_text(), name="key_prefix.py")
    spec = FilterSpec.from_file("eu", path, {"id": "eu", "prefixes": ["eu-"]}, section="eu")
    data = pickle.dumps([spec])
    assert pickle.loads(data) == [spec]
    path.unlink()  # executors on a cluster have no shared filesystem
    done = subprocess.run(
        [sys.executable, "-c", EXECUTOR],
        input=data,
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["None", "eu"]


def test_spec_repr_hides_source_and_config():
    spec = FilterSpec.from_file("k", SAMPLES / "key_prefix.py", {"token": "s3cret"}, section="k")
    assert "s3cret" not in repr(spec)
    assert "KeyPrefix" not in repr(spec)
