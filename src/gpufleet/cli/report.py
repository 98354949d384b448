"""`gpufleet report`: the HTML report of a plan saved with `gpufleet plan --json`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from gpufleet.cli.common import CatalogOption, JsonOption, open_catalog
from gpufleet.cli.output import Output
from gpufleet.input_files import load_json


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        plan_file: Path = typer.Argument(..., help="A plan saved with `gpufleet plan ... --json > PLAN.json` "
                                         "(one GPU count or a sweep)."),
        output: Path = typer.Option(..., "--output", "-o", help="The HTML file to write (.html or .htm)."),
        catalog: list[Path] = CatalogOption,
        json: bool = JsonOption,
    ) -> None:
        """Write the self-contained HTML report (charts, no network needed) of a saved plan.

        The plan is re-run from the request the file records, with the same catalog, and must reproduce the
        saved plans; pass the same --catalog files the plan was made with.

        Examples:

        * `gpufleet plan -m llama3-70b -t 15T -n 1024 --json > plan.json && gpufleet report plan.json -o plan.html`
        * `gpufleet plan -m llama3-70b -t 2T -n 256-4096 --deadline 30d --json > sweep.json; gpufleet report
          sweep.json -o sweep.html`
        """
        from gpufleet.report.plan_html import write_plan_report
        from gpufleet.report.plots import check_output_path
        from gpufleet.report.saved import read_saved_plan, rerun_figures

        out = Output(json)
        check_output_path(output, "--output", (".html", ".htm"))
        data = load_json(plan_file, "plan file", "write it with gpufleet plan ... --json")
        saved = read_saved_plan(data, str(plan_file))
        figures = rerun_figures(saved, open_catalog(catalog), str(plan_file))
        write_plan_report(output, figures, f"Re-planned from {plan_file.name}'s recorded request with the "
                          "current catalog; the ranked plans and their step times match the file.", "--output")

        def render(console: Console) -> None:
            console.print(f"wrote {output}")

        out.emit({"html": str(output), "plan_file": str(plan_file)}, render)
