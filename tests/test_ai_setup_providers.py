"""``fluid ai setup`` for openai_responses, the presets, bedrock and vertex (console script).

bedrock stores its region and vertex its project and location (never a cloud
credential: the output names where the credentials come from and the tool
that sets them up); openai_responses and the presets store their key like
every keyed provider. Each test runs in a fresh HOME with no keyring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_cli_conventions import fluid, fresh_env

NO_KEYRING = "keyring.backends.fail.Keyring"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def _env(home: Path, **extra: str) -> dict[str, str]:
    return fresh_env(
        home, PYTHON_KEYRING_BACKEND=NO_KEYRING, AWS_EC2_METADATA_DISABLED="true", **extra
    )


def _setup(home: Path, *args: str, env: dict[str, str], stdin: str = "") -> Any:
    import subprocess

    from tests.test_cli_conventions import FLUID

    assert FLUID is not None
    return subprocess.run(
        [FLUID, "ai", "setup", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _stored(home: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((home / ".config" / "fluid" / "ai_config.json").read_text())
    return data


def _doctor_row(home: Path, env: dict[str, str], name: str) -> dict[str, Any]:
    result = fluid(home, "doctor", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    return next(row for row in report["providers"] if row["name"] == name)


def test_bedrock_stores_its_region_and_names_the_credentials_it_never_stores(home: Path) -> None:
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = AKIAFAKE\naws_secret_access_key = {AWS_SECRET}\n"
    )
    env = _env(home)
    result = _setup(home, "--provider", "bedrock", "--region", "eu-west-3", env=env)
    assert result.returncode == 0, result.stderr
    assert "bedrock: eu-west-3 stored for AWS_REGION (used when it is not set)" in result.stdout
    assert (
        "bedrock: credentials: shared credentials file ~/.aws/credentials, profile default "
        "(never stored by fluid)"
    ) in result.stdout
    stored = _stored(home)
    assert stored["settings"] == {"bedrock": {"AWS_REGION": "eu-west-3"}}
    assert AWS_SECRET not in json.dumps(stored) + result.stdout + result.stderr
    row = _doctor_row(home, env, "bedrock")
    assert row["base_url"] == "https://bedrock-runtime.eu-west-3.amazonaws.com"
    assert row["credentials"]["region_source"] == "stored by fluid ai setup"
    # The environment wins over what is stored, and setup says so.
    again = _setup(home, "--provider", "bedrock", "--json", env={**env, "AWS_REGION": "us-west-2"})
    assert json.loads(again.stdout)["overridden_by_env"] == ["AWS_REGION"]
    said = _setup(home, "--provider", "bedrock", env={**env, "AWS_REGION": "us-west-2"})
    assert "note: AWS_REGION is set in this environment and wins over the stored setting" in (
        said.stderr
    )
    assert _doctor_row(home, {**env, "AWS_REGION": "us-west-2"}, "bedrock")["base_url"] == (
        "https://bedrock-runtime.us-west-2.amazonaws.com"
    )


def test_bedrock_without_credentials_or_region_points_to_the_aws_tools(home: Path) -> None:
    result = _setup(home, "--provider", "bedrock", "--json", env=_env(home))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["credentials"] is None
    warnings = " ".join(data["warnings"])
    assert "--region us-east-1" in warnings
    assert "`aws configure`" in warnings
    assert "`aws sso login --profile NAME`" in warnings
    assert "AWS_BEARER_TOKEN_BEDROCK" in warnings


def test_bedrock_bearer_token_is_named_never_shown(home: Path) -> None:
    token = "ABSKbedrock-api-key-secret-value"
    env = _env(home, AWS_BEARER_TOKEN_BEDROCK=token)
    result = _setup(home, "--provider", "bedrock", "--region", "us-east-1", env=env)
    assert result.returncode == 0, result.stderr
    assert "credentials: Bedrock API key (AWS_BEARER_TOKEN_BEDROCK)" in result.stdout
    assert token not in result.stdout + result.stderr + json.dumps(_stored(home))


def test_vertex_stores_project_and_location_and_points_to_gcloud(home: Path) -> None:
    env = _env(home)
    result = _setup(
        home, "--provider", "vertex", "--project", "my-proj", "--location", "global", env=env
    )
    assert result.returncode == 0, result.stderr
    assert "vertex: my-proj stored for GOOGLE_CLOUD_PROJECT" in result.stdout
    assert "`gcloud auth application-default login`" in result.stderr
    assert _stored(home)["settings"] == {
        "vertex": {"GOOGLE_CLOUD_LOCATION": "global", "GOOGLE_CLOUD_PROJECT": "my-proj"}
    }
    row = _doctor_row(home, env, "vertex")
    assert row["base_url"] == (
        "https://aiplatform.googleapis.com/v1/projects/my-proj/locations/global/publishers/google"
    )
    # A later setup without --location keeps the stored one.
    _setup(home, "--provider", "vertex", "--project", "other", env=env)
    assert _stored(home)["settings"]["vertex"] == {
        "GOOGLE_CLOUD_LOCATION": "global",
        "GOOGLE_CLOUD_PROJECT": "other",
    }


def test_vertex_names_a_gcloud_login(home: Path) -> None:
    gcloud = home / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    (gcloud / "application_default_credentials.json").write_text('{"type": "authorized_user"}')
    result = _setup(home, "--provider", "vertex", "--project", "p1", "--json", env=_env(home))
    data = json.loads(result.stdout)
    assert data["credentials"].startswith("gcloud application-default login")
    assert data["warnings"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--provider", "openai", "--region", "us-east-1"), "--region is for --provider bedrock"),
        (("--provider", "bedrock", "--project", "p"), "--project is for --provider vertex"),
        (("--provider", "vertex", "--project", "a b"), "may hold only letters"),
        (("--provider", "bedrock", "--region", "x" * 200), "must be 1 to 100 characters"),
    ],
)
def test_cloud_options_that_cannot_be_used_are_usage_errors(
    home: Path, args: tuple[str, ...], message: str
) -> None:
    result = _setup(home, *args, env=_env(home))
    assert result.returncode == 2
    assert message in result.stderr
    assert not (home / ".config" / "fluid" / "ai_config.json").exists()


def test_a_hand_edited_setting_that_cannot_be_used_is_ignored(home: Path) -> None:
    path = home / ".config" / "fluid" / "ai_config.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "provider": "bedrock",
                "settings": {
                    "bedrock": {"AWS_REGION": "us-east-1\n", "AWS_SECRET_ACCESS_KEY": "x"}
                },
            }
        )
    )
    path.chmod(0o600)
    result = fluid(home, "doctor", "--json", env=_env(home))
    report = json.loads(result.stdout)
    problems = " ".join(report["stored_config"]["problems"])
    assert "settings.bedrock.AWS_REGION may hold only letters" in problems
    assert "settings.bedrock.AWS_SECRET_ACCESS_KEY is not a stored setting" in problems


def test_check_refuses_cloud_providers_rather_than_guessing(home: Path) -> None:
    env = _env(home, FLUID_LLM_PROVIDER="bedrock", AWS_REGION="us-east-1")
    result = _setup(home, "--check", env=env)
    assert result.returncode == 2
    assert "--check does not test bedrock's cloud credentials: `fluid doctor`" in result.stderr


@pytest.mark.parametrize(
    ("provider", "variable", "key"),
    [
        ("openai_responses", "OPENAI_API_KEY", "sk-responses-0123456789"),
        ("xai", "XAI_API_KEY", "xai-0123456789abcdef"),
        ("deepseek", "DEEPSEEK_API_KEY", "sk-deepseek-0123456789"),
        ("together", "TOGETHER_API_KEY", "tgp_v1_0123456789abcdef"),
        ("fireworks", "FIREWORKS_API_KEY", "fw_0123456789abcdef"),
        ("cerebras", "CEREBRAS_API_KEY", "csk-0123456789abcdef"),
    ],
)
def test_keyed_new_providers_store_their_key_for_their_variable(
    home: Path, provider: str, variable: str, key: str
) -> None:
    env = _env(home, FLUID_ALLOW_PLAINTEXT_AI_SECRETS="1")
    result = _setup(home, "--provider", provider, "--model", "m1", "--json", env=env, stdin=key)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["provider"], data["key_source"]) == (provider, "file")
    assert not any("prefix" in w or "usually start" in w for w in data["warnings"])
    assert key not in result.stdout + result.stderr
    row = _doctor_row(home, env, provider)
    assert (row["key"]["present"], row["key"]["source"], row["selected"]) == (True, "file", True)
    overridden = _setup(
        home, "--provider", provider, "--no-key", "--json", env={**env, variable: "other-key-1"}
    )
    assert json.loads(overridden.stdout)["overridden_by_env"] == [variable]


@pytest.mark.parametrize(
    ("key", "warning"),
    [
        ("gsk_0123456789abcdef", "this key has the prefix of groq keys, not xai's"),
        ("0123456789abcdef", "xai keys usually start with 'xai-'; this one does not"),
    ],
)
def test_an_xai_key_that_does_not_look_like_one_is_warned_about(
    home: Path, key: str, warning: str
) -> None:
    env = _env(home, FLUID_ALLOW_PLAINTEXT_AI_SECRETS="1")
    result = _setup(home, "--provider", "xai", "--json", env=env, stdin=key)
    assert json.loads(result.stdout)["warnings"][0] == warning


def test_without_the_bedrock_extra_setup_and_doctor_name_the_pip_line(
    home: Path, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"  # botocore that cannot be imported, as when the extra is missing
    (hidden / "botocore").mkdir(parents=True)
    (hidden / "botocore" / "__init__.py").write_text("raise ImportError('no botocore here')\n")
    env = _env(home, PYTHONPATH=str(hidden), FLUID_LLM_PROVIDER="bedrock", AWS_REGION="us-east-1")
    result = _setup(home, "--provider", "bedrock", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["warnings"] == [
        "botocore is missing: pip install 'fluid-build[bedrock]'"
    ]
    doctor = fluid(home, "doctor", env=env)
    assert doctor.returncode == 0
    assert "bedrock: AWS credentials: none (botocore is missing: pip install" in doctor.stdout


def test_without_the_vertex_extra_setup_and_doctor_name_the_pip_line(
    home: Path, tmp_path: Path
) -> None:
    hidden = tmp_path / "hidden"  # google-auth that cannot be imported
    (hidden / "google").mkdir(parents=True)
    (hidden / "google" / "__init__.py").write_text("raise ImportError('no google here')\n")
    gcloud = home / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    (gcloud / "application_default_credentials.json").write_text('{"type": "authorized_user"}')
    env = _env(home, PYTHONPATH=str(hidden), FLUID_LLM_PROVIDER="vertex")
    result = _setup(home, "--provider", "vertex", "--project", "p1", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["warnings"] == [
        "google-auth is missing: pip install 'fluid-build[vertex]'"
    ]
    doctor = fluid(home, "doctor", env=env)
    assert doctor.returncode == 0
    assert (
        "vertex: Google credentials: gcloud application-default login (`gcloud auth "
        "application-default login`); but google-auth is missing: pip install"
    ) in doctor.stdout


def test_forge_after_vertex_setup_asks_for_an_intent_without_talking_of_a_key(
    home: Path,
) -> None:
    """issue 35 item 13: configured for Vertex (no key anywhere), `fluid forge` with no
    intent names the configured provider and a way to see the example that works for it:
    replaying the bundled cassette, which the test then runs as shown."""
    import re

    env = _env(home)
    assert _setup(home, "--provider", "vertex", "--project", "p1", env=env).returncode == 0
    done = fluid(home, "forge", env=env)
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.split())
    assert "give an INTENT_FILE to forge with vertex:" in said
    assert "no key" not in said
    advised = re.search(r"replay it offline: `(fluid forge --replay [^`]+)`", said)
    assert advised is not None, said
    shown = advised.group(1).split()
    replayed = fluid(home, *shown[1:], env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert (home / "forge-out" / "contract.fluid.yaml").is_file()
