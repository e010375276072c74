"""ConsentWizard: the first run. Plain words, every limit, a name for the leaderboard, then an explicit
"Start contributing". Nothing runs and nothing is sent before that button is pressed; pressing it
registers with the coordinator (off the GUI thread, through ``register``) and, if the server cannot be
reached, says so on the page and lets the volunteer press it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from app.core.config import MAX_NAME
from app.core.consent import Consent
from engine.resources import Settings

from .assets import icon

URL_RE = re.compile(r"^https?://[^\s/]+(:\d+)?(/\S*)?$")

WELCOME = """
<p><b>Learning@home</b> lets volunteers train large neural networks together, the way
Folding@home and BOINC share computers for science. Researchers split a big model into many small
parts, called <i>experts</i>; volunteers' computers each run a few of them.</p>
<p><b>What will run here:</b> a background program that keeps a few experts on this computer's
graphics card (or its processor when there is no suitable GPU). Researchers' computers send it
numbers to compute; it sends back results. It runs no code from the internet, reads none of your
files, and talks to other volunteers directly, encrypted.</p>
<p><b>When:</b> by default only while you are away from the computer. The moment you touch the
keyboard or mouse it stops taking work and frees the graphics card. You can pause it, snooze it or
quit it at any time from its icon, and change every limit on the next page now or later.</p>
<p><b>In return:</b> your name (or a nickname) appears on the project's leaderboard with the work
your computer did.</p>
"""


# register(consent, done) starts the registration off the GUI thread (``Lifecycle.register``); done(error_text
# or None) on it.
Register = Callable[[Consent, Callable[[str | None], None]], None]


class WelcomePage(QWizardPage):
    def __init__(self) -> None:
        super().__init__()
        self.setTitle("Welcome to Learning@home")
        self.setSubTitle("What this program does, in plain words.")
        text = QLabel(WELCOME, self, wordWrap=True)
        text.setTextFormat(Qt.TextFormat.RichText)
        text.setOpenExternalLinks(True)
        QVBoxLayout(self).addWidget(text)


class LimitsPage(QWizardPage):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        from .limits_form import LimitsForm

        self.setTitle("Your limits")
        self.setSubTitle("Learning@home never goes past these. The defaults suit most computers.")
        self.form = LimitsForm(settings)
        self.form.validity_changed.connect(lambda _ok: self.completeChanged.emit())
        self.scroller = QScrollArea(self)
        self.scroller.setWidgetResizable(True)
        self.scroller.setWidget(self.form)
        layout = QVBoxLayout(self)
        layout.addWidget(self.scroller)
        layout.addWidget(self.form.error_label)  # outside the scroll: why "Next" is off stays in sight

    def isComplete(self) -> bool:
        return self.form.valid


class AccountPage(QWizardPage):
    def __init__(self, coordinator_url: str, token_place: str, name: str = "", team: str = "") -> None:
        super().__init__()
        self.setTitle("You on the leaderboard")
        self.setSubTitle("The name others will see next to your computer's work.")
        form = QFormLayout(self)
        self.name = QLineEdit(name, self, maxLength=MAX_NAME, placeholderText="e.g. Ada or a nickname")
        self.team = QLineEdit(team, self, maxLength=MAX_NAME, placeholderText="optional")
        self.url = QLineEdit(coordinator_url, self)
        self.invite = QLineEdit("", self, maxLength=128, placeholderText="only if the project sent you one")
        self.autostart = QCheckBox("Start Learning@home when I log in", self)
        self.autostart.setChecked(True)
        for widget, label in (
            (self.name, "Display name"),
            (self.team, "Team"),
            (self.url, "Project server"),
            (self.invite, "Invitation code"),
        ):
            widget.setAccessibleName(label)
            widget.textChanged.connect(lambda _text: self.completeChanged.emit())
        self.url_error = QLabel("", self, wordWrap=True)
        form.addRow("&Display name:", self.name)
        form.addRow("&Team:", self.team)
        form.addRow("&Invitation code:", self.invite)
        form.addRow("Project &server:", self.url)
        form.addRow("", self.url_error)
        form.addRow(self.autostart)
        where = QLabel(f"Your account's key will be kept in {token_place}.", self, wordWrap=True)
        where.setObjectName("tokenPlace")
        form.addRow(where)

    def isComplete(self) -> bool:
        url_ok = bool(URL_RE.match(self.url.text().strip()))
        self.url_error.setText("" if url_ok else "The server address must start with http:// or https://")
        return bool(self.name.text().strip()) and url_ok


class ConfirmPage(QWizardPage):
    def __init__(self) -> None:
        super().__init__()
        self.setTitle("Ready when you are")
        self.setSubTitle("Nothing has run and nothing has been sent yet.")
        layout = QVBoxLayout(self)
        self.summary = QLabel(self, wordWrap=True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.progress = QLabel("", self, wordWrap=True)
        self.progress.setObjectName("registrationStatus")
        self.progress.setAccessibleName("Registration status")
        layout.addWidget(self.summary)
        layout.addStretch(1)
        layout.addWidget(self.progress)


class ConsentWizard(QWizard):
    def __init__(
        self,
        settings: Settings,
        coordinator_url: str,
        token_place: str,
        register: Register,
        *,
        name: str = "",
        team: str = "",
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Learning@home: join")
        self.setWindowIcon(icon("app"))
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnLastPage, False)
        self.setButtonText(QWizard.WizardButton.FinishButton, "Start contributing")
        self.register = register
        self.consent: Consent | None = None
        self.welcome = WelcomePage()
        self.limits = LimitsPage(settings)
        self.account = AccountPage(coordinator_url, token_place, name, team)
        self.confirm = ConfirmPage()
        for page in (self.welcome, self.limits, self.account, self.confirm):
            self.addPage(page)
        self.currentIdChanged.connect(self._on_page)
        self.resize(720, 640)

    def _gather(self) -> Consent:
        return Consent(
            settings=self.limits.form.settings(),
            display_name=self.account.name.text().strip(),
            team=self.account.team.text().strip(),
            coordinator_url=self.account.url.text().strip().rstrip("/"),
            autostart=self.account.autostart.isChecked(),
            invite=self.account.invite.text().strip(),
        )

    def _on_page(self, _page_id: int) -> None:
        if self.currentPage() is not self.confirm:
            return
        c = self._gather()
        s = c.settings
        when = (
            f"only while you are away (no input for {s.idle_after_s} s)"
            if s.only_when_idle
            else "whenever allowed"
        )
        self.confirm.summary.setText(
            f"<p>When you press <b>Start contributing</b>, Learning@home will create your account "
            f"<b>{_esc(c.display_name)}</b>{' in team <b>' + _esc(c.team) + '</b>' if c.team else ''} on "
            f"<b>{_esc(c.coordinator_url)}</b> and start its engine, which will contribute {when}, "
            f"using at most {s.cpu_max_percent}% of the processor"
            f"{' and the graphics card' if s.use_gpu else ', never the graphics card'}.</p>"
            f"<p>{'It will start when you log in.' if c.autostart else 'It will not start at login.'}"
            " You can change all of this later under <i>Settings…</i> in its menu.</p>"
            f"<p>Updates: once a day it asks <b>{_esc(c.coordinator_url)}</b> where new versions are "
            "published and offers one only if the project's release key signed it. If that server names "
            "no such place, Learning@home does not look for updates anywhere else.</p>"
        )
        self.confirm.progress.setText("")

    def accept(self) -> None:
        """ "Start contributing": register first; close only once that worked."""
        if self.consent is not None:
            super().accept()
            return
        consent = self._gather()
        self.confirm.progress.setText("Contacting the project's server…")
        self.button(QWizard.WizardButton.FinishButton).setEnabled(False)
        self.button(QWizard.WizardButton.BackButton).setEnabled(False)

        def done(error: str | None) -> None:
            self.button(QWizard.WizardButton.FinishButton).setEnabled(True)
            self.button(QWizard.WizardButton.BackButton).setEnabled(True)
            if error is not None:
                self.confirm.progress.setText(f"{error}\nPress “Start contributing” to try again.")
                return
            self.consent = consent
            super(ConsentWizard, self).accept()

        self.register(consent, done)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
