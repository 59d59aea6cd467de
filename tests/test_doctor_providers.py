"""``fluid doctor`` for the cloud providers and the Responses API, from the console script.

Each test runs ``fluid doctor`` in a fresh HOME with one credential source set
up (fake ``~/.aws`` files, a generated service-account key, a bearer token)
and checks the line names where the credentials come from, never the secret;
nothing asks the network (AWS_EC2_METADATA_DISABLED, and a loopback socket
standing for a metadata server that must never be connected to).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.test_cli_conventions import fluid, fresh_env

AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
BEARER = "ABSKQmVkcm9ja0FQSUtleS1zZWNyZXQtdmFsdWU="


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def _aws_env(home: Path, **extra: str) -> dict[str, str]:
    return fresh_env(home, AWS_EC2_METADATA_DISABLED="true", **extra)


def _doctor(home: Path, env: dict[str, str], *secrets: str) -> tuple[str, dict[str, Any]]:
    """The text report and the --json report; asserts exit 0 and no secret in either."""
    text = fluid(home, "doctor", env=env)
    data = fluid(home, "doctor", "--json", env=env)
    for result in (text, data):
        assert result.returncode == 0, result.stderr
        for secret in secrets:
            assert secret not in result.stdout + result.stderr
    return text.stdout, json.loads(data.stdout)


def _row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in report["providers"] if row["name"] == name)


def _write_aws(home: Path, credentials: str = "", config: str = "") -> None:
    (home / ".aws").mkdir(exist_ok=True)
    (home / ".aws" / "credentials").write_text(credentials)
    (home / ".aws" / "config").write_text(config)


def test_bedrock_shared_credentials_profile_and_its_region(home: Path) -> None:
    _write_aws(
        home,
        f"[team]\naws_access_key_id = AKIAFAKEEXAMPLE\naws_secret_access_key = {AWS_SECRET}\n",
        "[profile team]\nregion = eu-west-3\n",
    )
    text, report = _doctor(home, _aws_env(home, AWS_PROFILE="team"), AWS_SECRET, "AKIAFAKEEXAMPLE")
    assert (
        "bedrock: AWS credentials: shared credentials file ~/.aws/credentials, profile team; "
        "region eu-west-3 (profile team); endpoint "
        "https://bedrock-runtime.eu-west-3.amazonaws.com (the region's endpoint)"
    ) in text
    found = _row(report, "bedrock")["credentials"]
    assert found["source"] == "shared credentials file ~/.aws/credentials, profile team"
    assert (found["region"], found["region_source"]) == ("eu-west-3", "profile team")


def test_bedrock_environment_credentials(home: Path) -> None:
    env = _aws_env(
        home,
        AWS_ACCESS_KEY_ID="AKIAFAKEEXAMPLE",
        AWS_SECRET_ACCESS_KEY=AWS_SECRET,
        AWS_REGION="us-west-2",
        AWS_ENDPOINT_URL_BEDROCK_RUNTIME="http://127.0.0.1:9/bedrock",
    )
    text, report = _doctor(home, env, AWS_SECRET)
    assert (
        "bedrock: AWS credentials: environment (AWS_ACCESS_KEY_ID); region us-west-2 "
        "(AWS_REGION); endpoint http://127.0.0.1:9/bedrock (AWS_ENDPOINT_URL_BEDROCK_RUNTIME)"
    ) in text
    assert _row(report, "bedrock")["credentials"]["checked"] is True


def test_bedrock_api_key_wins_and_is_never_shown(home: Path) -> None:
    _write_aws(
        home, f"[default]\naws_access_key_id = AKIA1\naws_secret_access_key = {AWS_SECRET}\n"
    )
    env = _aws_env(home, AWS_BEARER_TOKEN_BEDROCK=BEARER, AWS_DEFAULT_REGION="ap-south-1")
    text, report = _doctor(home, env, BEARER, AWS_SECRET)
    assert "bedrock: AWS credentials: Bedrock API key (AWS_BEARER_TOKEN_BEDROCK); region " in text
    assert "ap-south-1 (AWS_DEFAULT_REGION)" in text
    assert _row(report, "bedrock")["credentials"]["source"] == (
        "Bedrock API key (AWS_BEARER_TOKEN_BEDROCK)"
    )


def test_bedrock_sso_profile(home: Path) -> None:
    _write_aws(
        home,
        config=(
            "[profile dev]\nsso_start_url = https://example.awsapps.com/start\n"
            "sso_region = us-east-1\nsso_account_id = 111122223333\n"
            "sso_role_name = Dev\nregion = us-east-1\n"
        ),
    )
    text, _ = _doctor(home, _aws_env(home, AWS_PROFILE="dev"))
    assert "bedrock: AWS credentials: SSO profile dev (`aws sso login --profile dev`" in text


def test_bedrock_credential_process_is_never_run(home: Path) -> None:
    ran = home / "ran"
    _write_aws(home, config=f"[default]\nregion = us-east-1\ncredential_process = touch {ran}\n")
    text, report = _doctor(home, _aws_env(home))
    assert "credential_process of profile default (not run by doctor)" in text
    assert _row(report, "bedrock")["credentials"]["checked"] is False
    assert not ran.exists()


@pytest.mark.parametrize(
    "source", ["source_profile = base", "credential_source = Ec2InstanceMetadata"]
)
def test_bedrock_assumed_role_is_named_and_its_source_never_resolved(
    home: Path, source: str
) -> None:
    ran = home / "ran"
    _write_aws(
        home,
        config=(
            f"[profile ops]\nrole_arn = arn:aws:iam::111122223333:role/Ops\n{source}\n"
            f"region = us-east-1\n[profile base]\ncredential_process = touch {ran}\n"
        ),
    )
    with socket.socket() as listener:  # an instance metadata service never to be asked
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        env = fresh_env(
            home,
            AWS_PROFILE="ops",
            AWS_EC2_METADATA_SERVICE_ENDPOINT=f"http://127.0.0.1:{listener.getsockname()[1]}",
        )
        text, _ = _doctor(home, env)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert "bedrock: AWS credentials: assumed role of profile ops (not checked" in text
    assert not ran.exists()


def test_bedrock_container_role_is_named_not_asked(home: Path) -> None:
    with socket.socket() as listener:  # a credentials endpoint that must never be connected to
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/creds"
        env = _aws_env(home, AWS_CONTAINER_CREDENTIALS_FULL_URI=url, AWS_REGION="us-east-1")
        text, _ = _doctor(home, env)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert "container role (AWS_CONTAINER_CREDENTIALS_FULL_URI; not checked" in text


def test_bedrock_selected_without_credentials_says_so(home: Path) -> None:
    env = _aws_env(home, FLUID_LLM_PROVIDER="bedrock", AWS_REGION="us-east-1")
    text, report = _doctor(home, env)
    assert "bedrock: AWS credentials: none (no AWS credentials were found)" in text
    assert _row(report, "bedrock")["credentials"]["error"] == "no AWS credentials were found"


def test_bedrock_is_not_listed_when_nothing_is_configured(home: Path) -> None:
    # Off a cloud, an instance role is a guess, not a configuration: no line.
    env = fresh_env(
        home,
        AWS_EC2_METADATA_DISABLED="false",
        AWS_EC2_METADATA_SERVICE_ENDPOINT="http://127.0.0.1:9",
    )
    text, report = _doctor(home, env)
    assert "bedrock: AWS credentials" not in text
    assert _row(report, "bedrock")["credentials"]["checked"] is False


def _service_account(home: Path) -> tuple[Path, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    path = home / "sa.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "key-project",
                "private_key_id": "0123456789abcdef",
                "private_key": pem,
                "client_email": "runner@key-project.iam.gserviceaccount.com",
                "token_uri": "http://127.0.0.1:9/token",
            }
        )
    )
    return path, pem


def test_vertex_service_account_key_file_and_its_project(home: Path) -> None:
    path, pem = _service_account(home)
    env = fresh_env(home, GOOGLE_APPLICATION_CREDENTIALS=str(path))
    body = pem.splitlines()[1]  # a line of the key itself
    text, report = _doctor(home, env, body, "0123456789abcdef")
    assert (
        f"vertex: Google credentials: service-account key file {path}, "
        "runner@key-project.iam.gserviceaccount.com; project key-project (the key file); "
        "location us-central1 (default)"
    ) in text
    row = _row(report, "vertex")
    assert row["base_url"] == (
        "https://us-central1-aiplatform.googleapis.com/v1/projects/key-project/locations/"
        "us-central1/publishers/google"
    )
    assert row["credentials"]["project_source"] == "the key file"


def test_vertex_gcloud_login_project_and_location_from_the_environment(home: Path) -> None:
    gcloud = home / ".config" / "gcloud"
    gcloud.mkdir(parents=True)
    secret = "1//refresh-token-secret"
    (gcloud / "application_default_credentials.json").write_text(
        json.dumps({"type": "authorized_user", "refresh_token": secret, "client_secret": "x"})
    )
    env = fresh_env(home, GOOGLE_CLOUD_PROJECT="my-proj", GOOGLE_CLOUD_LOCATION="global")
    text, report = _doctor(home, env, secret)
    assert (
        "vertex: Google credentials: gcloud application-default login (`gcloud auth "
        "application-default login`); project my-proj (GOOGLE_CLOUD_PROJECT); location global "
        "(GOOGLE_CLOUD_LOCATION)"
    ) in text
    assert _row(report, "vertex")["base_url"].startswith("https://aiplatform.googleapis.com/v1/")


def test_vertex_access_token_is_never_shown(home: Path) -> None:
    token = "ya29.secret-access-token"
    env = fresh_env(
        home, FLUID_LLM_PROVIDER="vertex", FLUID_LLM_API_KEY=token, GOOGLE_CLOUD_PROJECT="p1"
    )
    text, _ = _doctor(home, env, token)
    assert "vertex: Google credentials: access token (FLUID_LLM_API_KEY); project p1" in text


def test_vertex_metadata_server_is_named_never_asked(home: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        host = f"127.0.0.1:{listener.getsockname()[1]}"
        env = fresh_env(
            home, FLUID_LLM_PROVIDER="vertex", GCE_METADATA_HOST=host, GOOGLE_CLOUD_PROJECT="p"
        )
        text, _ = _doctor(home, env)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert "vertex: Google credentials: metadata server (not checked" in text


def test_vertex_selected_with_a_broken_key_file(home: Path) -> None:
    bad = home / "bad.json"
    bad.write_text("not json at all")
    env = fresh_env(home, FLUID_LLM_PROVIDER="vertex", GOOGLE_APPLICATION_CREDENTIALS=str(bad))
    text, report = _doctor(home, env)
    assert f"GOOGLE_APPLICATION_CREDENTIALS: {bad} is not a JSON credentials file" in text
    assert _row(report, "vertex")["credentials"]["source"] is None


@pytest.mark.parametrize("kind", ["nested", "fifo"])
def test_vertex_key_file_nested_too_deep_or_a_fifo_is_reported_not_a_crash(
    home: Path, kind: str
) -> None:
    # A key file nested 100,000 deep (RecursionError) or a FIFO (a read that never ends):
    # reported like any unusable key file (issue 32 item 12).
    import os

    bad = home / "bad.json"
    if kind == "nested":
        bad.write_text("[" * 100_000 + "]" * 100_000)
    else:
        os.mkfifo(bad)
    env = fresh_env(home, FLUID_LLM_PROVIDER="vertex", GOOGLE_APPLICATION_CREDENTIALS=str(bad))
    text, report = _doctor(home, env)
    reason = "nests deeper than 16 levels" if kind == "nested" else "is a FIFO"
    assert f"GOOGLE_APPLICATION_CREDENTIALS: {bad} {reason}" in text
    assert _row(report, "vertex")["credentials"]["source"] is None


def test_openai_responses_and_a_preset_show_their_key_and_endpoint(home: Path) -> None:
    key, xai = "sk-responses-secret", "xai-secret-key"
    env = fresh_env(home, OPENAI_API_KEY=key, XAI_API_KEY=xai)
    _, report = _doctor(home, env, key, xai)
    responses = _row(report, "openai_responses")
    assert responses["key"]["source"] == "OPENAI_API_KEY"
    assert (responses["base_url"], responses["base_url_error"]) == (
        "https://api.openai.com/v1",
        None,
    )
    assert _row(report, "xai")["key"]["source"] == "XAI_API_KEY"
    assert _row(report, "xai")["base_url"] == "https://api.x.ai/v1"


def test_bedrock_profile_that_does_not_exist_is_named(home: Path) -> None:
    _write_aws(home, config="[profile real]\nregion = us-east-1\n")
    text, report = _doctor(home, _aws_env(home, AWS_PROFILE="missing", AWS_REGION="us-east-1"))
    assert (
        "bedrock: AWS credentials: none (ProfileNotFound: The config profile (missing) could "
        "not be found)"
    ) in text
    assert _row(report, "bedrock")["credentials"]["source"] is None
