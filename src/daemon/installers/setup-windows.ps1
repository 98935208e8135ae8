# svc provider setup (Windows, PowerShell 5.1 or newer).
#
# Downloads the provider daemon (svc_daemon.py, Python 3 standard library
# only) and installs it as a scheduled task that runs python.exe with the
# daemon directly (no wrapper), so stopping the task stops the daemon.
#
#   irm '{{BACKEND_URL}}/api/providers/setup-windows' -MaximumRedirection 0 -Headers @{ 'x-provider-key' = $env:PK } | iex
#
# Run mode: set $env:SVC_RUN_MODE to always-on (default: starts at boot and
# now), manual (installed, started with Start-ScheduledTask) or scheduled
# (starts at boot; jobs only inside the window of your preferences).
# Run again (after a key rotation, or to upgrade), it stops the daemon already
# running before it replaces the task, so that no daemon goes on with the old key.
$ErrorActionPreference = 'Stop'

$SvcApiKey = '{{API_KEY}}'
$SvcBackendUrl = '{{BACKEND_URL}}'
$RunMode = if ($env:SVC_RUN_MODE) { $env:SVC_RUN_MODE } else { 'always-on' }
$TaskName = 'svc-daemon'

if (@('always-on', 'manual', 'scheduled') -notcontains $RunMode) {
    throw "SVC_RUN_MODE must be always-on, manual or scheduled (got '$RunMode')"
}

function Find-Python {
    foreach ($candidate in @('python3.exe', 'python.exe', 'py.exe')) {
        $cmd = Get-Command $candidate -ErrorAction SilentlyContinue
        if ($null -ne $cmd) {
            $exe = $cmd.Source
            if ($candidate -eq 'py.exe') {
                $exe = (& $exe -3 -c 'import sys; print(sys.executable)').Trim()
            }
            & $exe -c 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)'
            if ($LASTEXITCODE -eq 0) { return $exe }
        }
    }
    throw 'Python 3.8 or newer is needed: install it from the Microsoft Store or python.org, then run this again.'
}

$Python = Find-Python
$IsAdmin = ([Security.Principal.WindowsPrincipal][Security.Principal.WindowsIdentity]::GetCurrent()).IsInRole(
    [Security.Principal.WindowsBuiltInRole]::Administrator)
$InstallDir = if ($IsAdmin) { Join-Path $env:ProgramData 'svc-daemon' } else { Join-Path $env:LOCALAPPDATA 'svc-daemon' }
$Daemon = Join-Path $InstallDir 'svc_daemon.py'
$WorkDir = Join-Path $InstallDir 'work'

Write-Host "==> installing the svc provider daemon into $InstallDir ($RunMode)"
New-Item -ItemType Directory -Force -Path $InstallDir | Out-Null
if ($IsAdmin) {
    # %ProgramData% lets every user read (and create files in) what is made under it, by inheritance; this
    # folder gets the daemon file (the provider key and the task-signing secret) and renters' tasks. So,
    # before anything goes in: its entries reset (an earlier install's, anyone's), inheritance removed, and
    # full control for SYSTEM (which runs the task) and Administrators only, passed down to everything
    # inside. Named by SID: the account names differ by language.
    & icacls.exe $InstallDir /reset | Out-Null
    if ($LASTEXITCODE -eq 0) {
        & icacls.exe $InstallDir /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)F' '*S-1-5-32-544:(OI)(CI)F' | Out-Null
    }
    if ($LASTEXITCODE -ne 0) { throw "could not make $InstallDir private (icacls exit $LASTEXITCODE)" }
}
New-Item -ItemType Directory -Force -Path $WorkDir | Out-Null
[Net.ServicePointManager]::SecurityProtocol = [Net.SecurityProtocolType]::Tls12
$Download = "$Daemon.download"
# The key travels in a header, not the URL, which proxies and server logs keep. No redirect is followed
# (one fails the install): PowerShell would send the header on to whatever host it names.
Invoke-WebRequest -UseBasicParsing -MaximumRedirection 0 -Uri ($SvcBackendUrl + '/api/providers/download/daemon') -Headers @{ 'x-provider-key' = $SvcApiKey } -OutFile $Download
& $Python -m py_compile $Download
if ($LASTEXITCODE -ne 0) { throw 'the downloaded daemon is not valid Python' }
Move-Item -Force -Path $Download -Destination $Daemon

try {
    $Prefs = @{ key = $SvcApiKey; run_mode = $RunMode } | ConvertTo-Json -Compress
    Invoke-RestMethod -Method Post -MaximumRedirection 0 -Uri ($SvcBackendUrl + '/api/providers/preferences') -ContentType 'application/json' -Body $Prefs | Out-Null
} catch {
    Write-Host '==> could not save the run mode (set it later in your dashboard)'
}

$Action = New-ScheduledTaskAction -Execute $Python -Argument ('"' + $Daemon + '"') -WorkingDirectory $InstallDir
$Settings = New-ScheduledTaskSettingsSet -AllowStartIfOnBatteries -DontStopIfGoingOnBatteries `
    -RestartCount 999 -RestartInterval (New-TimeSpan -Minutes 1) -ExecutionTimeLimit ([TimeSpan]::Zero) `
    -MultipleInstances IgnoreNew
if ($IsAdmin) {
    $Principal = New-ScheduledTaskPrincipal -UserId 'SYSTEM' -LogonType ServiceAccount -RunLevel Highest
    $Trigger = New-ScheduledTaskTrigger -AtStartup
} else {
    $Principal = New-ScheduledTaskPrincipal -UserId ([Security.Principal.WindowsIdentity]::GetCurrent().Name) -LogonType Interactive
    $Trigger = New-ScheduledTaskTrigger -AtLogOn
}
[Environment]::SetEnvironmentVariable('SVC_WORK_DIR', $WorkDir, $(if ($IsAdmin) { 'Machine' } else { 'User' }))

# An earlier install's daemon may be running, on the old file and key (after a key rotation, one the server
# refuses): Unregister-ScheduledTask leaves a running instance running, and the new task started beside it
# would make two daemons. So the task's instance, and any other process running this daemon file, is stopped
# and waited for before the task is replaced; as on Linux, a manual install starts the new one again only
# where one was running.
function Stop-Daemon {
    $stopped = $false
    $task = Get-ScheduledTask -TaskName $TaskName -ErrorAction SilentlyContinue
    if ($null -ne $task -and $task.State -eq 'Running') {
        Stop-ScheduledTask -TaskName $TaskName | Out-Null
        $stopped = $true
    }
    $running = @(Get-CimInstance -ClassName Win32_Process | Where-Object {
        $_.ProcessId -ne $PID -and $_.CommandLine -and $_.CommandLine.IndexOf($Daemon, [StringComparison]::OrdinalIgnoreCase) -ge 0
    })
    foreach ($proc in $running) {
        Stop-Process -Id $proc.ProcessId -Force -ErrorAction SilentlyContinue
        $stopped = $true
    }
    if ($running.Count -gt 0) {
        Wait-Process -Id ($running | ForEach-Object { $_.ProcessId }) -Timeout 60 -ErrorAction SilentlyContinue
        $left = @($running | Where-Object { $null -ne (Get-Process -Id $_.ProcessId -ErrorAction SilentlyContinue) })
        if ($left.Count -gt 0) {
            throw "could not stop the daemon already running (process $($left[0].ProcessId)): stop it, then run this again"
        }
    }
    return $stopped
}

$WasRunning = Stop-Daemon
Unregister-ScheduledTask -TaskName $TaskName -Confirm:$false -ErrorAction SilentlyContinue
if ($RunMode -eq 'manual') {
    Register-ScheduledTask -TaskName $TaskName -Action $Action -Settings $Settings -Principal $Principal `
        -Description 'svc GPU marketplace provider daemon' | Out-Null
    if ($WasRunning) {
        Start-ScheduledTask -TaskName $TaskName
        Write-Host "==> run mode manual: the daemon that was running was restarted on the new file; stop it with 'Stop-ScheduledTask -TaskName $TaskName'"
    } else {
        Write-Host "==> run mode manual: start it with 'Start-ScheduledTask -TaskName $TaskName'"
    }
} else {
    Register-ScheduledTask -TaskName $TaskName -Action $Action -Trigger $Trigger -Settings $Settings -Principal $Principal `
        -Description 'svc GPU marketplace provider daemon' | Out-Null
    Start-ScheduledTask -TaskName $TaskName
    Write-Host "==> started; check it with 'Get-ScheduledTask -TaskName $TaskName'"
}
if ($null -eq (Get-Command 'nvidia-smi.exe' -ErrorAction SilentlyContinue)) {
    Write-Host '==> note: nvidia-smi was not found; the daemon runs CPU-only jobs until an NVIDIA driver is installed'
}
Write-Host '==> done'
