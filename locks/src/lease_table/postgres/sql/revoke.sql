revoke all on function {functions} from public
