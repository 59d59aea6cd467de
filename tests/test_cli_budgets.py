"""USD budgets as an operator meets them: amounts, settings, `fluid doctor` (issue 35).

Amounts read the same everywhere (no exponent, nano-USD in JSON); a budget setting
that cannot work is named as a problem, never passed over; the CLI's refusal
says what the call would reserve and how to ask for less.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fluid_build.cli.exit_codes import EXIT_CODES
from fluid_build.copilot.agents.errors import AgentExecutionError
from fluid_build.copilot.health.budget import (
    BudgetSpec,
    budgets_from_env,
    ledger_for,
    usd_amount,
    usd_json,
    usd_text,
)
from fluid_build.copilot.health.cooldown import cooldown_store_from_env
from tests.test_cli_conventions import fluid, fresh_env

# -- one way to write an amount (item 14) ---------------------------------------------------


@pytest.mark.parametrize(
    ("usd", "shown"),
    [
        (1.2499999999999999e-05, "0.0000125"),  # a float sum of prices
        (2.6e-05, "0.000026"),
        (0.000025, "0.000025"),
        (0.1 + 0.2, "0.3"),
        (25.0, "25"),
        (1e9, "1000000000"),
        (0.0, "0"),
        (1 / 3, "0.333333333"),
        (1e-12, "under 0.000000001"),  # spent, however little: never "0"
    ],
)
def test_an_amount_reads_without_an_exponent_or_float_noise(usd: float, shown: str) -> None:
    assert usd_amount(usd) == shown


def test_micro_usd_and_json_amounts_are_rounded_to_nano_usd() -> None:
    assert usd_text(13) == "0.000013 USD"
    assert usd_text(0) == "0 USD"
    assert usd_json(1.2499999999999999e-05) == 1.25e-05
    assert json.dumps(usd_json(3 * 4.25e-05)) == "0.0001275"
    assert usd_json(None) is None


# -- FLUID_BUDGETS messages (item 14) ---------------------------------------------------------


def _refusal(text: str) -> str:
    with pytest.raises(AgentExecutionError) as caught:
        budgets_from_env({"FLUID_BUDGETS": text})
    assert caught.value.code == "llm.not_configured"
    return caught.value.message


@pytest.mark.parametrize("text", ["a=-1usd/day", "a=0usd", "a=-0.5usd", "a=2000000000usd"])
def test_an_amount_out_of_range_gets_one_message_whatever_its_sign(text: str) -> None:
    amount = text.split("=")[1].split("usd")[0]
    assert f"budget 'a' is {amount} USD: it must be above 0 and at most 1000000000 USD" in (
        _refusal(text)
    )


@pytest.mark.parametrize(("text", "said"), [("a=1eur", "is in 'eur'"), ("a=1", "has no currency")])
def test_a_budget_in_another_currency_says_only_usd_exists(text: str, said: str) -> None:
    assert f"budget 'a' {said}: budgets are in USD only, e.g. a=1usd" in _refusal(text)


def test_an_unknown_window_names_the_windows_there_are() -> None:
    assert "'/week': it must be /hour, /day or /month" in _refusal("a=1usd/week")


# -- fluid doctor (items 10 and 14) ---------------------------------------------------------


def _budget_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("budget ", "budgets:"))]


def test_doctor_shows_small_amounts_as_decimals_and_every_window_end(tmp_path: Path) -> None:
    env = fresh_env(tmp_path, FLUID_BUDGETS="tiny=0.000026usd/day; big=5usd", FLUID_BUDGET="tiny")
    ledger = ledger_for(cooldown_store_from_env(env))
    assert ledger is not None
    now = time.time()
    assert ledger.reserve(BudgetSpec("big", 5_000_000, ""), 13, "a", now + 60, now).granted
    ledger.settle("big", "a", 13, now)

    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    big, tiny = _budget_lines(done.stdout)
    assert big.startswith("budget big: 0.000013 USD spent, 0 reserved of 5, until reset")
    assert "(4.999987 left)" in big
    assert "window ends" not in big  # until reset: no window
    # Nothing spent from it yet, so the store has no record: its window ends all the same.
    assert tiny.startswith(
        "budget tiny (FLUID_BUDGET): 0 USD spent, 0 reserved of 0.000026/day (0.000026 left); "
        "window ends 00:00:00 UTC (in "
    )
    assert "e-05" not in done.stdout

    data = json.loads(fluid(tmp_path, "doctor", "--json", env=env).stdout)["budgets"]
    assert data["problems"] == []
    assert data["error"] is None
    assert data["selected"] == "tiny"
    rows = {row["name"]: row for row in data["budgets"]}
    assert rows["big"]["spent_usd"] == 1.3e-05
    assert rows["big"]["left_usd"] == 4.999987
    midnight = (int(now) // 86_400 + 1) * 86_400
    assert rows["tiny"]["window_end"] in (midnight, midnight + 86_400)  # a run across midnight


def test_doctor_names_a_budget_variable_no_budget_answers_to(tmp_path: Path) -> None:
    env = fresh_env(tmp_path, FLUID_BUDGETS="team=2usd/day; ci=1usd", FLUID_BUDGET="taem")
    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    problem = _budget_lines(done.stdout)[0]
    assert problem.startswith(
        "budgets: PROBLEM: FLUID_BUDGET=taem names no budget FLUID_BUDGETS declares "
        "(declared: ci, team); every call fails with llm.not_configured (exit 10)"
    )
    data = json.loads(fluid(tmp_path, "doctor", "--json", env=env).stdout)["budgets"]
    assert data["selected"] == "taem"
    assert len(data["problems"]) == 1
    # With no FLUID_BUDGETS at all, the name is as much a typo.
    bare = fluid(tmp_path, "doctor", env=fresh_env(tmp_path, FLUID_BUDGET="team"))
    assert "FLUID_BUDGET=team names no budget FLUID_BUDGETS declares (declared: none)" in (
        bare.stdout
    )


def test_doctor_names_a_budget_no_store_can_keep(tmp_path: Path) -> None:
    (tmp_path / "prompts.txt").write_text("hello\n", encoding="utf-8")
    env = fresh_env(
        tmp_path,
        FLUID_BUDGETS="team=1usd",
        FLUID_BUDGET="team",
        FLUID_COOLDOWN_URL="off",
        OPENAI_API_KEY="sk-budget-test",
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",  # never reached: the budget refuses first
    )
    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    assert _budget_lines(done.stdout)[0] == (
        "budgets: PROBLEM: FLUID_BUDGET=team needs a shared store, and FLUID_COOLDOWN_URL=off: "
        "every call is refused with budget.store_unavailable (exit 22) until FLUID_COOLDOWN_URL "
        "names a store (unset: the sqlite file), or FLUID_BUDGET_FAIL_OPEN=1 lets calls "
        "through unmetered"
    )
    # What doctor foretells is what a run does.
    run = fluid(tmp_path, "batch", "prompts.txt", env=env)
    assert run.returncode == EXIT_CODES["agent"]
    assert "[budget.store_unavailable]" in run.stderr
    unmetered = fluid(tmp_path, "doctor", env={**env, "FLUID_BUDGET_FAIL_OPEN": "1"})
    assert "FLUID_BUDGET_FAIL_OPEN=1 lets every call through unmetered" in unmetered.stdout


def test_doctor_says_a_malformed_fluid_budgets_is_a_setting_not_a_store_failure(
    tmp_path: Path,
) -> None:
    env = fresh_env(tmp_path, FLUID_BUDGETS="team=25eur/day", FLUID_BUDGET="team")
    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    (line,) = _budget_lines(done.stdout)
    assert line.startswith("budgets: PROBLEM: FLUID_BUDGETS cannot be used (budget 'team' is in ")
    assert line.endswith(
        "every call under a budget fails with llm.not_configured (exit 10) until it is fixed"
    )
    assert "could not be read" not in done.stdout


def test_reset_of_a_budget_nobody_has_is_a_usage_error_naming_those_there_are(
    tmp_path: Path,
) -> None:
    env = fresh_env(tmp_path, FLUID_BUDGETS="team=2usd/day; ci=1usd")
    done = fluid(tmp_path, "doctor", "--reset", "--budget", "nosuch", env=env)
    assert done.returncode == EXIT_CODES["usage"], done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(
        "could not clear budget nosuch: no budget 'nosuch': FLUID_BUDGETS declares ci, team, "
        "and the shared store keeps spend for none; nothing was cleared"
    )
    as_json = fluid(tmp_path, "doctor", "--reset", "--budget", "nosuch", "--json", env=env)
    assert as_json.returncode == EXIT_CODES["usage"]
    assert json.loads(as_json.stdout)["cleared"] is False

    # A declared budget with nothing spent is no typo; one the store keeps can be cleared
    # from a shell that does not declare it.
    assert fluid(tmp_path, "doctor", "--reset", "--budget", "ci", env=env).returncode == 0
    ledger = ledger_for(cooldown_store_from_env(env))
    assert ledger is not None
    now = time.time()
    assert ledger.reserve(BudgetSpec("old", 1_000_000, ""), 10, "h", now + 60, now).granted
    elsewhere = fresh_env(tmp_path)
    cleared = fluid(tmp_path, "doctor", "--reset", "--budget", "old", env=elsewhere)
    assert cleared.returncode == 0, cleared.stderr
    assert "cleared budget old" in cleared.stdout

    broken = fresh_env(tmp_path, FLUID_BUDGETS="team=2")
    unread = fluid(tmp_path, "doctor", "--reset", "--budget", "nosuch", env=broken)
    assert unread.returncode == EXIT_CODES["auth"]
    assert "FLUID_BUDGETS cannot be used" in unread.stderr


# -- the refusal (item 9) --------------------------------------------------------------------


def test_a_refused_call_says_what_it_would_reserve_and_the_flag_that_makes_it_fit(
    tmp_path: Path,
) -> None:
    import re

    (tmp_path / "prompts.txt").write_text("hello\n", encoding="utf-8")
    env = fresh_env(
        tmp_path,
        OPENAI_API_KEY="sk-budget-test",
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",  # the discard port: nothing listens
        FLUID_LLM_MAX_ATTEMPTS="1",
        FLUID_BUDGETS="tiny=0.00003usd/day",
        FLUID_BUDGET="tiny",
    )
    done = fluid(tmp_path, "batch", "prompts.txt", env=env)
    assert done.returncode == EXIT_CODES["agent"], done.stderr
    headline = next(line for line in done.stderr.splitlines() if line.startswith("fluid: "))
    assert headline.startswith(
        "fluid: AgentExecutionError [budget.cost_exhausted]: budget tiny has 0.00003 USD left "
        "(0 USD spent and 0 USD reserved by calls in flight, of 0.00003 USD/day), and this call "
        "to openai:gpt-4o-mini would reserve up to 0.009832 USD ("
    )
    assert "is spent" not in headline
    assert "in Python" not in done.stderr
    assert "server asked" not in done.stderr  # the wait is the budget's window
    fits = re.search(
        r"ask for them with --max-output-tokens (\d+), or use a cheaper model", headline
    )
    assert fits is not None, headline
    hint = next(line for line in done.stderr.splitlines() if line.startswith("hint: "))
    assert "--max-output-tokens" in hint

    # The advice works: with that cap the budget lets the call through (to a port where
    # nothing listens, so it fails there, past the budget).
    sent = fluid(tmp_path, "batch", "prompts.txt", "--max-output-tokens", fits[1], env=env)
    assert sent.returncode == EXIT_CODES["timeout"], sent.stderr
    assert "budget.cost_exhausted" not in sent.stdout + sent.stderr


def test_a_budget_that_no_answer_fits_in_says_so() -> None:
    from fluid_build.copilot.call.prices import ModelPrice
    from fluid_build.copilot.call.spend import BudgetGuard
    from fluid_build.copilot.health.budget import MemoryBudgetLedger

    guard = BudgetGuard(
        BudgetSpec("one", 500, ""),  # 0.0005 USD: less than the prompt alone costs
        MemoryBudgetLedger(),
        prices={"m": ModelPrice(input=1.0, output=2.0)},
        wall=lambda: 1_700_000_000.0,
    )
    with pytest.raises(AgentExecutionError) as caught:
        guard.spend("openai_compatible", "m", 1_000, 100, deadline=30).reserve()
    message = caught.value.message
    assert message.startswith("budget one has 0.0005 USD left (0 USD spent and 0 USD reserved")
    assert "it lasts until `fluid doctor --reset --budget one`" in message
    assert message.endswith(
        "not even a one-token answer fits in what is left: use a cheaper model (--model)"
    )
    assert caught.value.details["fitting_max_output_tokens"] is None


# -- the command line's way to say it (item 11) ----------------------------------------------


def test_a_client_naming_an_undeclared_budget_says_fluid_budget_from_the_command_line(
    tmp_path: Path,
) -> None:
    from fluid_build.cli._messages import describe
    from fluid_build.copilot.call.spend import BudgetGuard
    from fluid_build.copilot.health.store import MemoryCooldownStore

    (tmp_path / "prompts.txt").write_text("hello\n", encoding="utf-8")
    env = fresh_env(tmp_path, OPENAI_API_KEY="sk-budget-test", FLUID_BUDGETS="team=1usd")
    done = fluid(tmp_path, "batch", "prompts.txt", env={**env, "FLUID_BUDGET": "taem"})
    assert done.returncode == EXIT_CODES["auth"], done.stderr
    headline = done.stderr.splitlines()[0]
    assert "budget 'taem' is not declared there (declared: team); name one of those with " in (
        headline
    )
    assert "FLUID_BUDGET, or declare 'taem'" in headline
    assert "budget=" not in headline
    assert "in Python" not in done.stderr
    # The Python caller keeps the argument beside the variable.
    with pytest.raises(AgentExecutionError) as caught:
        BudgetGuard.from_env("taem", MemoryCooldownStore(), {"FLUID_BUDGETS": ""})
    assert "declare it, or unset FLUID_BUDGET (budget= in Python)" in caught.value.message
    assert "(budget= in Python)" not in describe(caught.value).headline


def test_vertex_advises_the_access_token_variable_and_python_keeps_api_key() -> None:
    from fluid_build.cli._messages import describe
    from fluid_build.copilot.llm import vertex

    assert "set FLUID_LLM_API_KEY to an access token (api_key= in Python)" in vertex._LOGIN
    assert "with api_key=" not in vertex._LOGIN
    error = vertex._not_configured(f"vertex found no Google credentials: {vertex._LOGIN}")
    shown = describe(error).headline
    assert shown.endswith("or set FLUID_LLM_API_KEY to an access token")
    assert "api_key" not in shown


def test_doctor_names_variables_never_python_arguments(tmp_path: Path) -> None:
    # Azure and the local servers have no base URL here: the cell says which variable sets it.
    env = fresh_env(tmp_path, FLUID_LLM_PROVIDER="vertex", GOOGLE_CLOUD_PROJECT="p")
    done = fluid(tmp_path, "doctor", env=env)
    assert done.returncode == 0, done.stderr
    assert "in Python" not in done.stdout
    assert "set AZURE_OPENAI_ENDPOINT, e.g. AZURE_OPENAI_ENDPOINT=" in done.stdout
    bare = fluid(tmp_path, "doctor", env=fresh_env(tmp_path))
    assert "or --provider, or run `fluid ai setup --provider <name>`" in bare.stdout
    assert "in Python" not in bare.stdout
    as_json = fluid(tmp_path, "doctor", "--json", env=fresh_env(tmp_path))
    assert "in Python" not in as_json.stdout
    data = json.loads(as_json.stdout)
    azure = next(row for row in data["providers"] if row["name"] == "azure")
    assert azure["base_url_error"].endswith(
        "AZURE_OPENAI_ENDPOINT=https://my-resource.openai.azure.com"
    )


def test_a_warning_the_command_prints_leaves_the_python_aside_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging

    from fluid_build.cli._console import warnings_once
    from fluid_build.copilot.agents.errors import python_aside

    with warnings_once():
        logging.getLogger("fluid_build.test").warning(
            "set its real size with FLUID_CAPABILITY_MATRIX %s", python_aside("capability_matrix")
        )
    assert capsys.readouterr().err == "warning: set its real size with FLUID_CAPABILITY_MATRIX\n"
