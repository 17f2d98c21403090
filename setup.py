"""Everything is declared in setup.cfg; this file only adds the example DAGs to the wheel.

The repository keeps them in dags/ (the tests, the demo and the docs use that folder), and
git holds one copy. The build copies them into the package as airflow_exactly_once/example_dags/,
so a user of the wheel finds them beside the code. An editable install skips the copy: there
the DAGs are in dags/ already.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

EXAMPLE_DAGS = Path(__file__).resolve().parent / "dags"


class BuildPyWithExampleDags(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        if not EXAMPLE_DAGS.is_dir():
            raise RuntimeError(f"{EXAMPLE_DAGS} is missing: build from a git checkout or from the sdist")
        target = Path(self.build_lib) / "airflow_exactly_once" / "example_dags"
        target.mkdir(parents=True, exist_ok=True)
        for dag_file in sorted(EXAMPLE_DAGS.glob("*.py")):
            self.copy_file(str(dag_file), str(target / dag_file.name))


setup(cmdclass={"build_py": BuildPyWithExampleDags})
