# Build the Windows installer on a Windows 10/11 x64 machine with Python 3.11+ and Inno Setup 6.
#
#   powershell -ExecutionPolicy Bypass -File installers\windows\build.ps1 [-Cuda cu128] [-Sign]
#
# -Cuda: the torch build (cpu, or a CUDA variant such as cu128: see installers/README.md, "torch").
# -Sign: sign the executable and the setup with signtool (certificate from $env:LAH_SIGN_CERT_SHA1).
param([string]$Cuda = "cu128", [switch]$Sign)
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")
$Version = (python -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")

python -m venv .venv-win
$Py = ".venv-win\Scripts\python.exe"
& $Py -m pip install --quiet --upgrade pip
& $Py -m pip install --quiet "torch==2.13.0" --index-url "https://download.pytorch.org/whl/$Cuda"
& $Py -m pip install --quiet -e ".[installer]"
# The compiled DTLS record layer, against OpenSSL 3 ($env:OPENSSL_DIR, e.g. from vcpkg or Shining Light's
# installer). Optional: without it the bundle runs the Python path, and --self-test and About say so.
& $Py setup.py --quiet build_ext --inplace

& $Py installers\render_icons.py assets\icons\app.svg build\icons --ico installers\windows\learning-at-home.ico
& .venv-win\Scripts\pyinstaller.exe --noconfirm --distpath dist --workpath build\pyinstaller installers\learning-at-home.spec
& $Py -m lah.bundle write dist\learning-at-home
& dist\learning-at-home\learning-at-home.exe --self-test
if ($LASTEXITCODE -ne 0) { throw "self-test failed" }

function Sign-File($Path) {
    & signtool sign /sha1 $env:LAH_SIGN_CERT_SHA1 /fd SHA256 /tr http://timestamp.digicert.com /td SHA256 $Path
    if ($LASTEXITCODE -ne 0) { throw "signtool failed on $Path" }
}
if ($Sign) {
    Sign-File dist\learning-at-home\learning-at-home.exe
    & $Py -m lah.bundle write dist\learning-at-home   # the signature changed the executable
}
& "${env:ProgramFiles(x86)}\Inno Setup 6\ISCC.exe" "/DAppVersion=$Version" installers\windows\learning-at-home.iss
if ($Sign) { Sign-File "dist\learning-at-home-$Version-windows-x86_64-setup.exe" }
