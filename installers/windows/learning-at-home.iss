; Inno Setup 6.3+ script: a per-user install of the one-folder bundle, no administrator rights needed.
;
;   iscc /DAppVersion=0.2.0 /DBundleDir=..\..\dist\learning-at-home installers\windows\learning-at-home.iss
;
; (installers/windows/build.ps1 runs it after PyInstaller; installers/README.md explains signing.)
; Installing over an older version replaces the program files only: settings, identity and experts'
; checkpoints live in %LOCALAPPDATA%\learning-at-home, outside {app}. The uninstaller asks whether to
; keep them.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#ifndef BundleDir
  #define BundleDir "..\..\dist\learning-at-home"
#endif
#define AppName "Learning@home"
#define AppExe "learning-at-home.exe"
#define DataDirName "learning-at-home"

[Setup]
; The AppId identifies the product across versions (upgrades find the old install); never change it.
AppId={{6F1D8A52-3C4B-4E8E-9B7A-5D2C1E0F4A31}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Learning@home contributors
AppPublisherURL=https://learning-at-home.org
AppSupportURL=https://learning-at-home.org/help
AppUpdatesURL=https://learning-at-home.org/download
; Per user: installs into %LOCALAPPDATA%\Programs, Start menu of this user, no UAC prompt.
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
UninstallDisplayIcon={app}\{#AppExe}
UninstallDisplayName={#AppName}
OutputDir=..\..\dist
OutputBaseFilename=learning-at-home-{#AppVersion}-windows-x86_64-setup
SetupIconFile=learning-at-home.ico
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
; The tray app and its node are closed before files are replaced, and started again after an update.
CloseApplications=yes
RestartApplications=no
MinVersion=10.0

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[InstallDelete]
; An older version's libraries must not linger next to the new ones (the bundle's manifest would
; not list them, and Python could import them): the program folder is replaced as a whole.
Type: filesandordirs; Name: "{app}\_internal"

[Files]
Source: "{#BundleDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"; Comment: "Lend this computer's idle time to train open neural networks"
Name: "{autoprograms}\{#AppName} self-test"; Filename: "{app}\{#AppExe}"; Parameters: "--self-test"; Comment: "Check this installation"

[Registry]
; The app adds this value when the volunteer asks it to start at login; the uninstaller removes it.
Root: HKCU; Subkey: "Software\Microsoft\Windows\CurrentVersion\Run"; ValueType: none; ValueName: "{#AppName}"; Flags: uninsdeletevalue dontcreatekey

[Run]
Filename: "{app}\{#AppExe}"; Description: "Start {#AppName} now"; Flags: nowait postinstall skipifsilent

[UninstallRun]
; Stop the tray app and its node (the same executable) so their files can be removed.
Filename: "{sys}\taskkill.exe"; Parameters: "/F /T /IM {#AppExe}"; Flags: runhidden; RunOnceId: "StopLearningAtHome"

[Code]
function DataDir(): String;
begin
  Result := ExpandConstant('{localappdata}\{#DataDirName}');
end;

procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
var
  Answer: Integer;
begin
  if (CurUninstallStep = usPostUninstall) and DirExists(DataDir()) then
  begin
    { Silent uninstalls (and the default button) keep the data: deleting is the one irreversible choice. }
    Answer := SuppressibleMsgBox(
      'Keep your Learning@home settings, identity and experts'' checkpoints?' + #13#10 + #13#10 +
      'They are in ' + DataDir() + '.' + #13#10 +
      'Keep them to pick up where you left off after reinstalling; choose No to delete them.',
      mbConfirmation, MB_YESNO or MB_DEFBUTTON1, IDYES);
    if Answer = IDNO then
    begin
      if not DelTree(DataDir(), True, True, True) then
        MsgBox('Some files in ' + DataDir() + ' could not be deleted; remove the folder by hand.',
          mbError, MB_OK);
    end;
  end;
end;
