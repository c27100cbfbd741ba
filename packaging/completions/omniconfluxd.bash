# bash completion for omniconfluxd(8): its options, commands, subcommands
# and their flags, and paths where a command takes one. Installed by
# packaging/install as share/bash-completion/completions/omniconfluxd.
# Plain bash: it needs nothing from the bash-completion package.
# tests/packaging.rs checks that it offers every command the binary has.

_omniconfluxd() {
    local cur=${COMP_WORDS[COMP_CWORD]}
    local prev=${COMP_WORDS[COMP_CWORD - 1]}
    local commands="serve gateway pair clients status call events seats sessions attach approvals lanes repos lock stop config plugin version help"
    local options="--config --state-dir --socket --json --help --version"
    COMPREPLY=()

    case $prev in
    --config | --socket)
        COMPREPLY=($(compgen -f -- "$cur"))
        return
        ;;
    --state-dir)
        COMPREPLY=($(compgen -d -- "$cur"))
        return
        ;;
    esac

    # The command and its arguments: every word that is not a global option
    # or an option's value, up to the word being completed.
    local i word cmd="" args=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        case $word in
        --config | --state-dir | --socket) ((i++)) ;;
        --json | --help | -h | --version | -V | --) ;;
        *)
            if [[ -z $cmd ]]; then cmd=$word; else args+=("$word"); fi
            ;;
        esac
    done

    if [[ $cur == -* && -z $cmd ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
        return
    fi

    local sub=${args[0]-} words=""
    case $cmd in
    "") words=$commands ;;
    help) ((${#args[@]} == 0)) && words=$commands ;;
    serve) words="--http --gateway" ;;
    gateway) words="--listen" ;;
    pair) words="--url --e2e" ;;
    clients) ((${#args[@]} == 0)) && words="list remove" ;;
    events) words="--stream --after --follow" ;;
    seats) ((${#args[@]} == 0)) && words="list probe" ;;
    sessions) ((${#args[@]} == 0)) && words="list get spawn input interrupt kill" ;;
    approvals)
        case $sub in
        "") words="list allow deny" ;;
        list) words="--all" ;;
        esac
        ;;
    lanes)
        case $sub in
        "") words="list show close merge rework dispatch" ;;
        close) words="--remove-worktree" ;;
        dispatch)
            case $prev in
            --repo)
                COMPREPLY=($(compgen -d -- "$cur"))
                return
                ;;
            esac
            words="--repo --task --builder --verifier --acceptance-name --acceptance --name --base"
            ;;
        esac
        ;;
    repos)
        case $sub in
        "") words="list add" ;;
        add)
            COMPREPLY=($(compgen -d -- "$cur"))
            return
            ;;
        esac
        ;;
    lock)
        case $sub in
        "") words="status log init sign revoke add-signer remove-signer disable pin unpin local-disable revoke-signer-start revoke-signer-cosign revoke-signer-finish" ;;
        init) words="--signer --device --disablements" ;;
        revoke-signer-start) words="--replace --fork-from" ;;
        esac
        ;;
    config)
        case $sub in
        "") words="check" ;;
        check)
            COMPREPLY=($(compgen -f -- "$cur"))
            return
            ;;
        esac
        ;;
    plugin)
        case $sub in
        "") words="install list show approve discard enable disable remove commands run" ;;
        install)
            COMPREPLY=($(compgen -d -- "$cur"))
            return
            ;;
        approve) words="--yes --operator" ;;
        remove) words="--keep-tasks" ;;
        esac
        ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}

complete -F _omniconfluxd omniconfluxd
